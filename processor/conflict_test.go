package processor_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// An event id published again with another payload is dead-lettered as a
// conflict, whether the member's LRU or Postgres finds it, and the first
// version's effects stand (emails_sent has no unique key; the counters add).
func TestConflictingDuplicateThroughThePipeline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cache int
	}{{"lru", 1000}, {"postgres", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			eachBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 1)
				x, y := uuid.New(), uuid.New()
				first := orders.Order{UserID: 1, Items: []string{"A"}}
				e.produce(wire.NewRecord(e.topic, x, order(first)))
				m := e.start(e.config("member"), e.writer(tc.cache))
				e.waitProcessed(1, 60*time.Second)
				// The same id with another payload, then a new event.
				e.produce(wire.NewRecord(e.topic, x, order(orders.Order{UserID: 2, Items: []string{"B", "B"}})),
					wire.NewRecord(e.topic, y, order(orders.Order{UserID: 3, Items: []string{"C"}})))
				e.waitProcessed(2, 60*time.Second)
				m.stop(t)
				if s := m.c.Stats(); s.Conflicts != 1 {
					t.Errorf("Stats.Conflicts = %d, want 1", s.Conflicts)
				}
				if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE event_id = $1 AND reason = $2`,
					x, sink.ReasonConflict); n != 1 {
					t.Errorf("conflict dead letters of x = %d, want 1", n)
				}
				e.checkExactlyOnce(map[uuid.UUID]orders.Order{x: first, y: {UserID: 3, Items: []string{"C"}}})
			})
		})
	}
}

func order(o orders.Order) []byte {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return b
}
