package sink_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/orders"
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
