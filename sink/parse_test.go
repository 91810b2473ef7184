package sink_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
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
		return writerWith(t, pool, schema, sink.Config{Handlers: []sink.Handler{probe}, Cache: cache, Parse: parse})
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
	w := writerWith(t, pool, schema, sink.Config{Parse: func(sink.Event) (any, error) { panic("parser bug") }})
	id := uuid.New()
	_, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Partition: 0, Epoch: take(t, w), Fence: -1, NextOffset: 1,
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

// An event Parse refuses that the batch carries twice (a producer's retry)
// is refused at both offsets, as a handler's RejectError refuses it: the
// later copy lost its claims to the first one's, which are taken back, so
// it is no duplicate of anything committed. Nothing of it is remembered as
// committed: the event's id carrying a valid order later applies.
func TestWriteParseRefusesEveryCopy(t *testing.T) {
	for _, withParse := range []bool{false, true} {
		t.Run(fmt.Sprintf("parse=%v", withParse), func(t *testing.T) {
			pool := sinktest.Pool(t)
			schema := sinktest.Schema(t, pool, orders.Migrate)
			ctx := t.Context()
			cache, _ := dedup.New(1000)
			w := writerWith(t, pool, schema, sink.Config{Parse: parseIf(withParse), Cache: cache})
			epoch := take(t, w)
			p, y := uuid.New(), uuid.New()
			bad := []byte(`{"user_id":7,"items":[]}`)
			res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 3,
				Events: events(0, []uuid.UUID{p, y, p}, [][]byte{bad, order(2, "B"), bad})})
			if err != nil {
				t.Fatal(err)
			}
			hn := len(orders.Names)
			if res.Applied != hn || res.SkippedPostgres != 0 || res.DeadLetters != 2 {
				t.Errorf("applied %d, skipped by postgres %d, dead letters %d; want %d, 0 (no key of p is committed), 2 (one per copy of p)",
					res.Applied, res.SkippedPostgres, res.DeadLetters, hn)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1 AND reason LIKE 'rejected: %'`, p); n != 2 {
				t.Errorf("dead letters of p = %d, want 2", n)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.processed_events WHERE event_id = $1`, p); n != 0 {
				t.Errorf("processed_events rows of p = %d, want 0", n)
			}
			// The producer fixes p's payload: nothing of p applied, so it does.
			res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: 3, NextOffset: 4,
				Events: events(3, []uuid.UUID{p}, [][]byte{order(1, "A")})})
			if err != nil {
				t.Fatal(err)
			}
			if res.Applied != hn || res.Conflicts != 0 {
				t.Errorf("p with a valid order: applied %d, conflicts %d, skipped by the lru %d; want %d, 0, 0",
					res.Applied, res.Conflicts, res.SkippedLRU, hn)
			}
		})
	}
}

// An event Parse refuses, followed in the same batch by the same id with a
// valid payload (the producer's correction), is refused as a handler's
// RejectError refuses it: the refused version applied nothing, so the
// corrected one is no conflicting duplicate of it, and applies.
func TestWriteParseRefusedThenCorrected(t *testing.T) {
	for _, withParse := range []bool{false, true} {
		t.Run(fmt.Sprintf("parse=%v", withParse), func(t *testing.T) {
			pool := sinktest.Pool(t)
			schema := sinktest.Schema(t, pool, orders.Migrate)
			ctx := t.Context()
			w := writerWith(t, pool, schema, sink.Config{Parse: parseIf(withParse)})
			p := uuid.New()
			res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: take(t, w), Fence: -1, NextOffset: 2,
				Events: events(0, []uuid.UUID{p, p}, [][]byte{[]byte(`{"user_id":7,"items":[]}`), order(1, "A")})})
			if err != nil {
				t.Fatal(err)
			}
			hn := len(orders.Names)
			if res.Applied != hn || res.Conflicts != 0 || res.DeadLetters != 1 {
				t.Errorf("applied %d, conflicts %d, dead letters %d; want %d (the corrected version), 0, 1 (the refused one)",
					res.Applied, res.Conflicts, res.DeadLetters, hn)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent WHERE event_id = $1 AND user_id = 1`, p); n != 1 {
				t.Errorf("emails of the corrected version = %d, want 1", n)
			}
		})
	}
}

// parseIf is orders.ParseEvent when on, else no Parse (the handlers parse
// and reject for themselves: the reference behaviour).
func parseIf(on bool) func(sink.Event) (any, error) {
	if on {
		return orders.ParseEvent
	}
	return nil
}
