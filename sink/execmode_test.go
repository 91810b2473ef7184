package sink_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A writer works whatever default_query_exec_mode the user's DSN sets (a
// transaction pooler needs exec or simple_protocol): its claims, look-ups,
// SQL handlers and offsets, for new events and for redelivered ones.
func TestWriteExecModes(t *testing.T) {
	base := sinktest.Pool(t)
	schema := sinktest.Schema(t, base)
	table := schema + ".seen"
	exec(t, base, `CREATE TABLE `+table+` (event_id uuid, payload jsonb)`)
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool := sinktest.ModePool(t, mode)
			h := newSQLHandler(t, sink.SQLHandlerConfig{Name: "copy", SQL: `INSERT INTO ` + table + ` SELECT event_id, payload FROM events`})
			topic := "t_" + mode
			w, epoch := sqlWriter(t, pool, schema, topic, h)
			ids := []uuid.UUID{uuid.New(), uuid.New()}
			evs := events(0, ids, [][]byte{[]byte(`{"a":1}`), []byte(`{"a":2}`)})
			for i := range evs {
				evs[i].Topic = topic
			}
			res, err := w.Write(t.Context(), &sink.Batch{Topic: topic, Epoch: epoch, Fence: -1, NextOffset: 2, Events: evs})
			if err != nil {
				t.Fatalf("first write: %v", err)
			}
			if res.Applied != 2 {
				t.Errorf("first write applied %d, want 2: %+v", res.Applied, res)
			}
			// Redelivered, with one new event: found in Postgres, not applied again.
			again := append(evs, events(2, []uuid.UUID{uuid.New()}, [][]byte{[]byte(`{"a":3}`)})...)
			again[2].Topic = topic
			res, err = w.Write(t.Context(), &sink.Batch{Topic: topic, Epoch: epoch, Fence: 2, NextOffset: 3, Events: again})
			if err != nil {
				t.Fatalf("redelivery: %v", err)
			}
			if res.Applied != 1 || res.SkippedPostgres+res.SkippedLRU != 2 {
				t.Errorf("redelivery applied %d, skipped %d+%d; want 1 and 2", res.Applied, res.SkippedPostgres, res.SkippedLRU)
			}
			if n := sinktest.Count(t, base, `SELECT count(*) FROM `+table+` WHERE event_id = ANY($1)`, append(ids, again[2].ID)); n != 3 {
				t.Errorf("%d rows written by the handler, want 3", n)
			}
		})
	}
}
