package sink_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// With Config.Parse, a batch parses each claimed event once for all its
// handlers, hands the result to every handler, and turns an event Parse
// refuses into a dead letter in the same transaction: no rollback, no
// isolation, no claim left behind. Events no handler claims are not parsed.
func TestWriteParse(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	var parses atomic.Int64
	parse := func(e sink.Event) (any, error) {
		parses.Add(1)
		return orders.ParseEvent(e)
	}
	var unparsed atomic.Int64 // events a handler received without a parsed order
	probe := sink.HandlerFunc("probe", func(_ context.Context, _ pgx.Tx, events []sink.Event) error {
		for _, e := range events {
			if _, ok := e.Parsed.(orders.Order); !ok {
				unparsed.Add(1)
			}
		}
		return nil
	})
	writer := func(cache *dedup.Cache) *sink.Writer {
		hs, err := orders.Handlers(schema)
		if err != nil {
			t.Fatal(err)
		}
		w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: append(hs, probe), Cache: cache, Parse: parse})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	cache, _ := dedup.New(1000)
	w := writer(cache)

	a, b, c, poison := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	want := map[uuid.UUID]orders.Order{a: {UserID: 1, Items: []string{"A"}}, b: {UserID: 2, Items: []string{"B", "C"}}, c: {UserID: 3, Items: []string{"A"}}}
	val := func(id uuid.UUID) []byte { o := want[id]; return order(o.UserID, o.Items...) }
	batch := &sink.Batch{Topic: "orders", Partition: 0, Epoch: take(t, w), Fence: -1, NextOffset: 5,
		Events: events(0, []uuid.UUID{a, b, poison, c, a},
			[][]byte{val(a), val(b), []byte(`{"user_id":7,"items":[]}`), val(c), val(a)})}
	res, err := w.Write(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if got := parses.Load(); got != 4 {
		t.Errorf("Parse called %d times for 4 distinct events and 5 handlers, want 4", got)
	}
	if got := unparsed.Load(); got != 0 {
		t.Errorf("%d events reached a handler without Event.Parsed", got)
	}
	if res.Attempts != 1 || res.Applied != 15 || len(res.Rejected) != 1 || res.DeadLetters != 1 {
		t.Errorf("attempts %d, applied %d, rejected %d, dead letters %d; want 1, 15 (3 events × 5 handlers), 1, 1",
			res.Attempts, res.Applied, len(res.Rejected), res.DeadLetters)
	}
	if len(res.Rejected) == 1 && (res.Rejected[0].EventID.UUID != poison || !strings.HasPrefix(res.Rejected[0].Reason, "rejected: not an order: items is empty")) {
		t.Errorf("rejected %+v, want the poison event with reason rejected: not an order: items is empty", res.Rejected[0])
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.processed_events WHERE event_id = $1`, poison); n != 0 {
		t.Errorf("%d processed_events rows for the refused event, want none", n)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1 AND reason LIKE 'rejected: not an order%'`, poison); n != 1 {
		t.Errorf("dead letters for the refused event = %d, want 1", n)
	}

	// Redelivered to a writer with no cache: every key is lost at the
	// claim, so nothing is parsed and nothing applies; the refused event is
	// refused again (it was never claimed).
	cold := writer(nil)
	parses.Store(0)
	again := &sink.Batch{Topic: "orders", Partition: 0, Epoch: take(t, cold), Fence: 5, NextOffset: 8,
		Events: events(5, []uuid.UUID{a, b, c}, [][]byte{val(a), val(b), val(c)})}
	res, err = cold.Write(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	if got := parses.Load(); got != 0 || res.Applied != 0 || res.SkippedPostgres != 15 {
		t.Errorf("redelivery: %d parses, applied %d, skipped by postgres %d; want 0, 0, 15", got, res.Applied, res.SkippedPostgres)
	}
	rep, err := orders.Check(ctx, pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}

// A panic in Parse fails the batch (retried later, like a handler's
// panic) instead of dead-lettering the event or crashing the worker, and
// nothing of the batch is committed.
func TestWriteParsePanics(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	hs, err := orders.Handlers(schema)
	if err != nil {
		t.Fatal(err)
	}
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: hs,
		Parse: func(sink.Event) (any, error) { panic("parser bug") }})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.New()
	_, err = w.Write(t.Context(), &sink.Batch{Topic: "orders", Partition: 0, Epoch: take(t, w), Fence: -1, NextOffset: 1,
		Events: events(0, []uuid.UUID{id}, [][]byte{order(1, "A")})})
	if err == nil || !strings.Contains(err.Error(), "parser bug") || sink.IsData(err) {
		t.Fatalf("Write = %v; want an error naming the panic, not a data error", err)
	}
	for _, table := range []string{"processed_events", "dead_letters", "emails_sent"} {
		if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.`+table); n != 0 {
			t.Errorf("%s has %d rows after the failed batch, want 0", table, n)
		}
	}
}
