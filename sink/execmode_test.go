package sink_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
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

// An isolating transaction works whatever default_query_exec_mode the DSN
// sets: it holds the batch's keys (one of them claimed in an older slice,
// one repeated, one reused with another payload) before its savepoints,
// dead-letters the culprit with no claim, and applies the others once.
func TestWriteIsolatesExecModes(t *testing.T) {
	base := sinktest.Pool(t)
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			pool := sinktest.ModePool(t, mode)
			schema := sinktest.Schema(t, base)
			effects := pgx.Identifier{schema, "effects"}.Sanitize()
			exec(t, base, `CREATE TABLE `+effects+` (event_id uuid, "offset" bigint)`)
			bad := uuid.New()
			h := sink.HandlerFunc("h", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
				ids, offsets := make([]string, len(events)), make([]int64, len(events))
				for i, e := range events {
					if e.ID == bad {
						_, err := tx.Exec(ctx, `SELECT 1/0`)
						return err
					}
					ids[i], offsets[i] = e.ID.String(), e.Offset
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+effects+` SELECT * FROM unnest($1::text[]::uuid[], $2::bigint[])`, ids, offsets)
				return err
			})
			w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: []sink.Handler{h}})
			if err != nil {
				t.Fatal(err)
			}
			epoch := take(t, w)
			old := uuid.New()
			if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 1,
				Events: events(0, []uuid.UUID{old}, [][]byte{[]byte(`{"v":0}`)})}); err != nil {
				t.Fatalf("first write: %v", err)
			}
			r := dedup.Retention{Pool: base, Schema: schema, Horizon: 24 * time.Hour, Slices: 24}
			exec(t, base, `UPDATE `+pgx.Identifier{schema, "processed_events_slices"}.Sanitize()+` SET started_at = now() - interval '2 hours'`)
			if res, err := r.Step(ctx); err != nil || !res.Rotated {
				t.Fatalf("step = %+v, %v; want a rotation", res, err)
			}
			e := uuid.New()
			ids := []uuid.UUID{old, e, e, bad, old, uuid.New()}
			vals := [][]byte{[]byte(`{"v":0}`), []byte(`{"v":1}`), []byte(`{"v":1}`), []byte(`{}`), []byte(`{"v":9}`), []byte(`{}`)}
			res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: 1, NextOffset: 7, Events: events(1, ids, vals)})
			if err != nil {
				t.Fatalf("write: %v", err)
			}
			if res.Attempts != 2 || res.Applied != 2 || res.Conflicts != 1 || len(res.Rejected) != 2 {
				t.Errorf("result: attempts %d, applied %d, conflicts %d, dead letters %+v; want 2, 2, 1, 2",
					res.Attempts, res.Applied, res.Conflicts, res.Rejected)
			}
			for _, c := range []struct {
				what string
				sql  string
				arg  uuid.UUID
				want int64
			}{
				{"effects of the repeated event", `SELECT count(*) FROM ` + effects + ` WHERE event_id = $1`, e, 1},
				{"effects of the old event", `SELECT count(*) FROM ` + effects + ` WHERE event_id = $1`, old, 1},
				{"claims of the old event", `SELECT count(*) FROM ` + schema + `.processed_events WHERE event_id = $1`, old, 1},
				{"claims of the repeated event", `SELECT count(*) FROM ` + schema + `.processed_events WHERE event_id = $1`, e, 1},
				{"claims of the culprit", `SELECT count(*) FROM ` + schema + `.processed_events WHERE event_id = $1`, bad, 0},
			} {
				if n := sinktest.Count(t, base, c.sql, c.arg); n != c.want {
					t.Errorf("%s: %d, want %d", c.what, n, c.want)
				}
			}
		})
	}
}
