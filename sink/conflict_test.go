package sink_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A conflicting duplicate — an event id seen again with another payload —
// is dead-lettered with ReasonConflict, whichever layer finds it, and the
// first version's effects stand. Effects are counted in emails_sent (no
// unique key) and in the added-to inventory counters.
func TestConflictingDuplicateIsDeadLettered(t *testing.T) {
	first, second := order(1, "A"), order(2, "B", "B")
	for _, tc := range []struct {
		name      string
		lru       bool
		sameBatch bool // both versions in one batch
		noDigest  bool // the first row was written before digests existed
		narrow    bool // the first version was applied by emailHandler only
		same      bool // the second delivery carries the same payload
		conflict  bool
	}{
		{name: "found by the LRU", lru: true, conflict: true},
		{name: "found by Postgres", conflict: true},
		{name: "in one batch", sameBatch: true, conflict: true},
		{name: "a handler new to the id claims nothing", narrow: true, conflict: true},
		{name: "same payload is a plain duplicate (LRU)", lru: true, same: true},
		{name: "same payload is a plain duplicate (Postgres)", same: true},
		{name: "a row without a digest cannot conflict", noDigest: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := sinktest.Pool(t)
			schema := sinktest.Schema(t, pool, orders.Migrate)
			ctx := t.Context()
			var cache *dedup.Cache
			if tc.lru {
				cache, _ = dedup.New(1000)
			}
			w := newWriter(t, pool, schema, cache)
			epoch := take(t, w)
			x, y := uuid.New(), uuid.New()
			again := second
			if tc.same {
				again = first
			}
			var res sink.Result
			var err error
			if tc.sameBatch {
				res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 3,
					Events: events(0, []uuid.UUID{x, y, x}, [][]byte{first, order(3, "C"), again})})
				if err != nil {
					t.Fatal(err)
				}
			} else {
				firstWriter := w
				if tc.narrow {
					hs, _ := orders.Handlers(schema, "emailHandler")
					firstWriter, err = sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: hs})
					if err != nil {
						t.Fatal(err)
					}
				}
				if _, err := firstWriter.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 1,
					Events: events(0, []uuid.UUID{x}, [][]byte{first})}); err != nil {
					t.Fatal(err)
				}
				if tc.noDigest {
					if _, err := pool.Exec(ctx, `UPDATE `+schema+`.processed_events SET payload_digest = NULL`); err != nil {
						t.Fatal(err)
					}
				}
				res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: 1, NextOffset: 3,
					Events: events(1, []uuid.UUID{x, y}, [][]byte{again, order(3, "C")})})
				if err != nil {
					t.Fatal(err)
				}
			}
			wantConflicts := 0
			if tc.conflict {
				wantConflicts = 1
			}
			if res.Conflicts != wantConflicts {
				t.Errorf("Result.Conflicts = %d, want %d (result %+v)", res.Conflicts, wantConflicts, res)
			}
			if tc.lru && !tc.narrow && res.SkippedPostgres != 0 && tc.conflict {
				t.Errorf("the LRU should have found the conflict without Postgres: %+v", res)
			}
			n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = '`+x.String()+
				`' AND reason = '`+sink.ReasonConflict+`'`)
			if n != int64(wantConflicts) {
				t.Errorf("conflict dead letters for x = %d, want %d", n, wantConflicts)
			}
			// The first version's effects stand, once: one email to user 1,
			// item A reserved once, nothing of the second version.
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent WHERE event_id = '`+x.String()+`' AND user_id = 1`); n != 1 {
				t.Errorf("emails of the first version = %d, want 1", n)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent WHERE event_id = '`+x.String()+`' AND user_id <> 1`); n != 0 {
				t.Errorf("emails of the second version = %d, want 0", n)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent WHERE event_id = '`+y.String()+`'`); n != 1 {
				t.Errorf("emails of the other event of the batch = %d, want 1 (the rest applies)", n)
			}
			wantA := int64(1)
			if tc.narrow {
				wantA = 0 // inventoryHandler never applied x
			}
			if n := sinktest.Count(t, pool, `SELECT coalesce(sum(reserved), 0) FROM `+schema+`.inventory_reserved WHERE item = 'A'`); n != wantA {
				t.Errorf("item A reserved = %d, want %d", n, wantA)
			}
			if n := sinktest.Count(t, pool, `SELECT coalesce(sum(reserved), 0) FROM `+schema+`.inventory_reserved WHERE item = 'B'`); n != 0 {
				t.Errorf("item B reserved = %d, want 0 (the second version applies nothing)", n)
			}
			wantRows := int64(len(orders.Names))
			if tc.narrow {
				wantRows = 1 // the claims of the refused version were taken back
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.processed_events WHERE event_id = '`+x.String()+`'`); n != wantRows {
				t.Errorf("processed_events rows of x = %d, want %d", n, wantRows)
			}
		})
	}
}

// topicHandler applies the events of one topic only, as an SQL handler
// with topics does.
type topicHandler struct{ name, topic string }

func (h topicHandler) Name() string                                      { return h.name }
func (h topicHandler) Consumes(topic string) bool                        { return topic == h.topic }
func (h topicHandler) Apply(context.Context, pgx.Tx, []sink.Event) error { return nil }

// The same event id on two topics, with another payload on each, read by
// handlers of one topic each, is no conflict: the dedup key is (event id,
// handler), and each handler saw one payload. The LRU must decide as
// Postgres does, though it holds one entry per event: a plain redelivery on
// the first topic is a duplicate, and the second topic's payload
// redelivered on the first topic is a conflict.
func TestSameIDOnTwoTopics(t *testing.T) {
	for _, lru := range []bool{false, true} {
		t.Run(fmt.Sprintf("lru=%v", lru), func(t *testing.T) {
			pool := sinktest.Pool(t)
			schema := sinktest.Schema(t, pool)
			ctx := t.Context()
			var cache *dedup.Cache
			if lru {
				cache, _ = dedup.New(1000)
			}
			w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Cache: cache,
				Handlers: []sink.Handler{topicHandler{"a", "t1"}, topicHandler{"b", "t2"}}})
			if err != nil {
				t.Fatal(err)
			}
			epochs := map[string]int64{}
			next := map[string]int64{}
			for _, topic := range []string{"t1", "t2"} {
				leases, err := w.Take(ctx, topic, []int32{0})
				if err != nil {
					t.Fatal(err)
				}
				epochs[topic], next[topic] = leases[0].Epoch, -1
			}
			x := uuid.New()
			write := func(topic string, value []byte) sink.Result {
				t.Helper()
				offset := max(next[topic], 0)
				res, err := w.Write(ctx, &sink.Batch{Topic: topic, Epoch: epochs[topic], Fence: next[topic], NextOffset: offset + 1,
					Events: []sink.Event{{ID: x, Value: value, Topic: topic, Offset: offset}}})
				if err != nil {
					t.Fatal(err)
				}
				next[topic] = offset + 1
				return res
			}
			first, second := order(1, "A"), order(2, "B")
			if res := write("t1", first); res.Applied != 1 {
				t.Fatalf("t1: applied %d, want 1", res.Applied)
			}
			if res := write("t2", second); res.Applied != 1 || res.Conflicts != 0 {
				t.Fatalf("t2: applied %d, conflicts %d; want 1, 0 (another handler)", res.Applied, res.Conflicts)
			}
			res := write("t1", first)
			if res.Conflicts != 0 || res.SkippedLRU+res.SkippedPostgres != 1 {
				t.Errorf("t1 redelivered: conflicts %d, skipped %d (lru %d); want 0, 1 (a plain duplicate for handler a)",
					res.Conflicts, res.SkippedLRU+res.SkippedPostgres, res.SkippedLRU)
			}
			res = write("t1", second)
			if res.Conflicts != 1 {
				t.Errorf("t2's payload on t1: conflicts %d, skipped %d (lru %d); want 1 conflict (handler a applied another payload)",
					res.Conflicts, res.SkippedLRU+res.SkippedPostgres, res.SkippedLRU)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1 AND reason = $2`, x, sink.ReasonConflict); n != 1 {
				t.Errorf("conflict dead letters = %d, want 1 (the last delivery only)", n)
			}
		})
	}
}
