package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A relay that dies after publishing but before marking leaves its rows
// leased; once the lease has run out, another relay publishes them again,
// and the consumer side applies each event once all the same. (This test
// alone reaches past the producer side, to show the two layers together.)
func TestCrashBetweenPublishAndMarkIsAbsorbed(t *testing.T) {
	pool, schema, brokers := setup(t)
	if err := orders.Migrate(t.Context(), pool, schema); err != nil {
		t.Fatal(err)
	}
	s := store(t, pool, schema)
	ctx := t.Context()
	want := map[uuid.UUID]orders.Order{}
	for i := range 100 {
		id := uuid.New()
		o := orders.Order{UserID: int64(i + 1), Items: []string{"A", "B"}}
		want[id] = o
		if _, err := s.Enqueue(ctx, Event{ID: id, Payload: []byte(fmt.Sprintf(`{"user_id":%d,"items":["A","B"]}`, o.UserID))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	dying := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	dying.afterPublish = func() error { return errors.New("relay died before marking") }
	if _, err := dying.RelayOnce(ctx); err == nil {
		t.Fatal("the first relay pass did not fail")
	}
	next := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	if k, err := next.RelayOnce(ctx); err != nil || k != 0 {
		t.Fatalf("while the dead relay's lease runs, another relayed %d rows (%v), want 0", k, err)
	}
	// The lease runs out.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if k, err := next.RelayOnce(ctx); err != nil || k != 100 {
		t.Fatalf("after the lease, the other relay relayed %d rows (%v), want all 100 again", k, err)
	}
	for id, c := range published(t, brokers, 200) {
		if c != 2 {
			t.Fatalf("event %s is on the topic %d times, want 2 (published, not marked, published again)", id, c)
		}
	}
	consume(t, pool, schema, brokers, 200)
	rep, err := orders.Check(ctx, pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}

// consume runs a consumer over the topic until n records are committed.
func consume(t *testing.T, pool *pgxpool.Pool, schema string, brokers []string, n int64) {
	hs, _ := orders.Handlers(schema)
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: hs})
	if err != nil {
		t.Fatal(err)
	}
	c, err := processor.New(processor.Config{Brokers: brokers, Topics: []string{topic}, Group: "g",
		KafkaOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}}, w)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for sinktest.Count(t, pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets`) < n {
		if time.Now().After(deadline) {
			t.Fatal("the consumer did not reach the end of the topic")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
