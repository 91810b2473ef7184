package sink_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A batch of 200 records that all fail in a SQL handler whose statement
// takes 20 ms (so isolating them in one transaction takes several
// seconds), then a good one, written with AllowPrefix under a TxTimeout of
// one second: each Write commits a prefix of what it was given, never
// nothing, with its dead letters and its offset, in one transaction; the
// caller writes the rest from Result.NextOffset, and in the end every bad
// record is a dead letter once and the good one applied once.
func TestIsolationCommitsPrefixes(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	payments := pgx.Identifier{schema, "payments"}.Sanitize()
	exec(t, pool, `CREATE TABLE `+payments+` (event_id uuid NOT NULL, amount numeric NOT NULL)`)
	h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: "pay",
		SQL: `WITH s AS (SELECT pg_sleep(0.02)) INSERT INTO ` + payments + ` SELECT event_id, (payload->>'amount')::numeric FROM events, s`})
	if err != nil {
		t.Fatal(err)
	}
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: []sink.Handler{h},
		TxTimeout: time.Second, IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	epoch := take(t, w)
	const bad = 200
	var ids []uuid.UUID
	var vals [][]byte
	for i := range bad {
		ids, vals = append(ids, uuid.New()), append(vals, fmt.Appendf(nil, `{"amount":"bad-%d"}`, i))
	}
	good := uuid.New()
	ids, vals = append(ids, good), append(vals, []byte(`{"amount":"12.50"}`))
	all := events(0, ids, vals)

	fence, writes, timeouts := int64(-1), 0, 0
	for next := int64(0); next < bad+1; {
		writes++
		if writes > 200 {
			t.Fatalf("%d writes and %d timeouts, stored offset still %d of %d", writes, timeouts, next, bad+1)
		}
		res, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: fence, NextOffset: bad + 1,
			Events: all[next:], AllowPrefix: true})
		if err != nil {
			// A transaction may still run out of time (a loaded machine);
			// it commits nothing and is retried.
			if !sink.IsTimeout(err) {
				t.Fatalf("write from %d: %v", next, err)
			}
			timeouts++
			continue
		}
		if res.NextOffset <= next || res.NextOffset > bad+1 {
			t.Fatalf("write from %d: Result.NextOffset %d, want progress up to at most %d", next, res.NextOffset, bad+1)
		}
		wantDead := min(res.NextOffset, bad) - next
		if int64(res.DeadLetters) != wantDead || int64(len(res.Rejected)) != wantDead {
			t.Errorf("write from %d to %d: %d dead letters (%d rejected), want %d", next, res.NextOffset, res.DeadLetters, len(res.Rejected), wantDead)
		}
		for _, d := range res.Rejected {
			if d.Offset < next || d.Offset >= res.NextOffset {
				t.Errorf("write from %d to %d: dead letter at offset %d", next, res.NextOffset, d.Offset)
			}
		}
		if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters`); n != min(res.NextOffset, bad) {
			t.Errorf("after the write to %d: %d dead letters stored, want %d", res.NextOffset, n, min(res.NextOffset, bad))
		}
		if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets`); n != res.NextOffset {
			t.Errorf("stored offset %d, want Result.NextOffset %d", n, res.NextOffset)
		}
		next, fence = res.NextOffset, res.NextOffset
	}
	t.Logf("%d bad records isolated in %d writes (%d timed out)", bad, writes, timeouts)
	if writes-timeouts < 2 {
		t.Errorf("the batch was written in %d transactions: isolating it in one should not fit in TxTimeout", writes-timeouts)
	}
	for _, c := range []struct {
		what string
		sql  string
		want int64
	}{
		{"dead letters", `SELECT count(*) FROM ` + schema + `.dead_letters WHERE reason LIKE '%SQLSTATE 22P02%'`, bad},
		{"distinct dead-lettered offsets", `SELECT count(DISTINCT "offset") FROM ` + schema + `.dead_letters`, bad},
		{"payments", `SELECT count(*) FROM ` + payments, 1},
		{"claims", `SELECT count(*) FROM ` + schema + `.processed_events`, 1},
	} {
		if n := sinktest.Count(t, pool, c.sql); n != c.want {
			t.Errorf("%s: %d, want %d", c.what, n, c.want)
		}
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+payments+` WHERE event_id = $1`, good); n != 1 {
		t.Errorf("payments of the good record: %d, want 1", n)
	}
}

// A batch marked Isolate is isolated from the start, in one transaction,
// and the outcome is what the plain transaction then the isolating one
// would give: the bad records are dead letters, the others apply once; a
// batch with no bad record applies whole.
func TestIsolateHintChangesNoOutcome(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	payments := pgx.Identifier{schema, "payments"}.Sanitize()
	exec(t, pool, `CREATE TABLE `+payments+` (event_id uuid NOT NULL, amount numeric NOT NULL)`)
	h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: "pay",
		SQL: `INSERT INTO ` + payments + ` SELECT event_id, (payload->>'amount')::numeric FROM events`})
	if err != nil {
		t.Fatal(err)
	}
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: []sink.Handler{h}})
	if err != nil {
		t.Fatal(err)
	}
	epoch := take(t, w)
	bad := map[int]bool{0: true, 1: true, 3: true, 7: true, 8: true, 15: true}
	var ids []uuid.UUID
	var vals [][]byte
	for i := range 40 {
		ids = append(ids, uuid.New())
		if bad[i] {
			vals = append(vals, fmt.Appendf(nil, `{"amount":"bad-%d"}`, i))
		} else {
			vals = append(vals, []byte(`{"amount":"1"}`))
		}
	}
	all := events(0, ids, vals)
	res, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 20, Events: all[:20], Isolate: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 1 || res.Applied != 20-len(bad) || len(res.Rejected) != len(bad) || res.NextOffset != 20 {
		t.Errorf("result: attempts %d, applied %d, dead letters %d, next offset %d; want 1, %d, %d, 20",
			res.Attempts, res.Applied, len(res.Rejected), res.NextOffset, 20-len(bad), len(bad))
	}
	for _, d := range res.Rejected {
		if !bad[int(d.Offset)] {
			t.Errorf("dead letter at offset %d, a good record", d.Offset)
		}
	}
	res, err = w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: 20, NextOffset: 40, Events: all[20:], Isolate: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 1 || res.Applied != 20 || len(res.Rejected) != 0 {
		t.Errorf("result of the good batch: attempts %d, applied %d, dead letters %d; want 1, 20, 0", res.Attempts, res.Applied, len(res.Rejected))
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+payments); n != 40-int64(len(bad)) {
		t.Errorf("payments: %d, want %d", n, 40-len(bad))
	}
	if n := sinktest.Count(t, pool, `SELECT count(DISTINCT event_id) FROM `+payments); n != 40-int64(len(bad)) {
		t.Errorf("events paid: %d, want %d", n, 40-len(bad))
	}
}

// A batch written with Batch.Stop already closed (its caller must give the
// partition up) commits, if it must isolate culprits, the prefix settled
// by the time the isolation's first event is: never nothing, and no more
// than that; the stored offset and dead letters are that prefix's. Without
// AllowPrefix, or with no culprit to isolate, Stop changes nothing.
func TestIsolationStopsAtOnce(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	for _, c := range []struct {
		name        string
		bad         []bool // per record
		allowPrefix bool
		wantNext    int64 // stored and returned
		wantDead    int64
		wantApplied int64
	}{
		// The first group that applies holds the first two: the rest
		// waits.
		{"good records first", []bool{false, false, true, true, false, true, false, false}, true, 2, 0, 2},
		// The first record is a culprit, found alone after a few halvings.
		{"all bad", []bool{true, true, true, true, true, true, true, true}, true, 1, 1, 0},
		{"without AllowPrefix", []bool{false, false, true, true, false, true, false, false}, false, 8, 3, 5},
		{"nothing to isolate", []bool{false, false, false, false}, true, 4, 0, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool := sinktest.Pool(t)
			schema := sinktest.Schema(t, pool)
			payments := pgx.Identifier{schema, "payments"}.Sanitize()
			exec(t, pool, `CREATE TABLE `+payments+` (event_id uuid NOT NULL, amount numeric NOT NULL)`)
			h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: "pay",
				SQL: `INSERT INTO ` + payments + ` SELECT event_id, (payload->>'amount')::numeric FROM events`})
			if err != nil {
				t.Fatal(err)
			}
			w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: []sink.Handler{h}})
			if err != nil {
				t.Fatal(err)
			}
			epoch := take(t, w)
			var ids []uuid.UUID
			var vals [][]byte
			for i, bad := range c.bad {
				ids = append(ids, uuid.New())
				if bad {
					vals = append(vals, fmt.Appendf(nil, `{"amount":"bad-%d"}`, i))
				} else {
					vals = append(vals, []byte(`{"amount":"1"}`))
				}
			}
			n := int64(len(c.bad))
			res, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: n,
				Events: events(0, ids, vals), AllowPrefix: c.allowPrefix, Stop: closed})
			if err != nil {
				t.Fatal(err)
			}
			if res.NextOffset != c.wantNext || int64(res.DeadLetters) != c.wantDead || int64(res.Applied) != c.wantApplied {
				t.Errorf("result: next offset %d, dead letters %d, applied %d; want %d, %d, %d",
					res.NextOffset, res.DeadLetters, res.Applied, c.wantNext, c.wantDead, c.wantApplied)
			}
			for _, q := range []struct {
				what string
				sql  string
				want int64
			}{
				{"stored offset", `SELECT next_offset FROM ` + schema + `.sink_offsets`, c.wantNext},
				{"dead letters", `SELECT count(*) FROM ` + schema + `.dead_letters`, c.wantDead},
				{"payments", `SELECT count(*) FROM ` + payments, c.wantApplied},
				{"claims", `SELECT count(*) FROM ` + schema + `.processed_events`, c.wantApplied},
			} {
				if got := sinktest.Count(t, pool, q.sql); got != q.want {
					t.Errorf("%s: %d, want %d", q.what, got, q.want)
				}
			}
		})
	}
}
