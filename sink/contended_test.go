package sink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A claim that meets a concurrent one (a key of its batch claimed by
// another transaction meanwhile) makes the Writer claim by insert until
// sink.InsertRun claims in a row meet none; a contended claim by insert
// starts the run again, and one that won fewer than half its keys (a
// re-read) ends it. Each key lost to the other transaction is skipped,
// every other key applied once; a redelivery with another payload is a
// conflict by insert as by COPY, whether the look-up finds its key or a
// concurrent claim takes it while the claim waits.
func TestWriteInsertsAfterContention(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	rec := tracetest.NewSpanRecorder()
	w := writerWith(t, pool, schema, sink.Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	epoch := take(t, w)
	hn := len(orders.Names)
	next := int64(0)
	var first uuid.UUID // the first batch's event, written with order(1, "A")
	write := func(ids ...uuid.UUID) (sink.Result, error) {
		vs := make([][]byte, len(ids))
		for i, id := range ids {
			vs[i] = order(int64(i+1), "A")
			if id == first && next > 0 {
				vs[i] = order(99, "B") // a redelivery with another payload
			}
		}
		fence := next
		if next == 0 {
			fence = -1
		}
		res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: fence,
			NextOffset: next + int64(len(ids)), Events: events(next, ids, vs)})
		if err == nil {
			next += int64(len(ids))
		}
		return res, err
	}
	// byInsert is the onceflow.claim.by_insert attribute of the last claim
	// span, and whether it was contended.
	byInsert := func() (insert, contended bool) {
		t.Helper()
		spans := rec.Ended()
		for i := len(spans) - 1; i >= 0; i-- {
			if spans[i].Name() != "dedup.claim" {
				continue
			}
			seen := 0
			for _, kv := range spans[i].Attributes() {
				switch kv.Key {
				case "onceflow.claim.by_insert":
					insert = kv.Value.AsBool()
					seen++
				case "onceflow.claim.contended":
					contended = kv.Value.AsBool()
					seen++
				}
			}
			if seen != 2 {
				t.Fatalf("the last dedup.claim span has no by_insert and contended attributes: %v", spans[i].Attributes())
			}
			return insert, contended
		}
		t.Fatal("no dedup.claim span")
		return false, false
	}
	// contended writes a new event and x, whose email key another
	// transaction holds and commits while the Write waits for it; with
	// conflict, that claim stores the digest of another payload than the
	// Write's.
	contended := func(step string, wantInsert, conflict bool) {
		t.Helper()
		x, y := uuid.New(), uuid.New()
		hold, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Rollback(context.Background()) //nolint:errcheck // committed below
		var ds []dedup.Digest
		if conflict {
			ds = []dedup.Digest{dedup.PayloadDigest(order(99, "B"))}
		}
		if got, err := dedup.Claim(ctx, hold, schema, "kafka", "", []dedup.Key{{EventID: x, Handler: orders.Email}}, ds); err != nil || !got[0] {
			t.Fatalf("%s: hold x: %v, %v", step, got, err)
		}
		type result struct {
			res sink.Result
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := write(y, x)
			done <- result{res, err}
		}()
		waitBlockedBy(t, pool, hold)
		if err := hold.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("%s: %v", step, r.err)
		}
		switch {
		case conflict:
			if r.res.Applied != hn || r.res.Conflicts != 1 {
				t.Errorf("%s: applied %d, conflicts %d; want %d, 1 (x a conflict, none of its effects)", step, r.res.Applied, r.res.Conflicts, hn)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1 AND reason = $2`, x, sink.ReasonConflict); n != 1 {
				t.Errorf("%s: conflict dead letters for x: %d, want 1", step, n)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent WHERE event_id = $1`, x); n != 0 {
				t.Errorf("%s: emails for x: %d, want 0", step, n)
			}
		case r.res.Applied != 2*hn-1 || r.res.SkippedPostgres != 1 || r.res.Conflicts != 0:
			t.Errorf("%s: applied %d, skipped %d, conflicts %d; want %d, 1, 0 (x's email lost to the other claim)",
				step, r.res.Applied, r.res.SkippedPostgres, r.res.Conflicts, 2*hn-1)
		}
		if insert, contended := byInsert(); insert != wantInsert || !contended {
			t.Errorf("%s: claimed by insert %v, contended %v; want %v, true", step, insert, contended, wantInsert)
		}
	}
	// quiet writes a new event and checks how it was claimed.
	quiet := func(step string, wantInsert bool) {
		t.Helper()
		res, err := write(uuid.New())
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if res.Applied != hn {
			t.Errorf("%s: applied %d, want %d", step, res.Applied, hn)
		}
		if insert, contended := byInsert(); insert != wantInsert || contended {
			t.Errorf("%s: claimed by insert %v, contended %v; want %v, false", step, insert, contended, wantInsert)
		}
	}

	first = uuid.New()
	if res, err := write(first); err != nil || res.Applied != hn {
		t.Fatalf("a first batch: applied %d, %v; want %d", res.Applied, err, hn)
	}
	contended("a contended COPY", false, false)
	for i := range 3 {
		quiet(fmt.Sprintf("batch %d after the contended COPY", i+1), true)
	}
	// A claim by insert, which looks nothing up, still refuses a
	// conflicting duplicate (its digest read after the insert skipped it);
	// the key it met keeps the Writer inserting.
	if res, err := write(first); err != nil || res.Applied != 0 || res.Conflicts != 1 {
		t.Errorf("the first event again with another payload, by insert: applied %d, conflicts %d, %v; want 0, 1", res.Applied, res.Conflicts, err)
	}
	if insert, contended := byInsert(); !insert || !contended {
		t.Errorf("the conflicting redelivery: claimed by insert %v, contended %v; want true, true", insert, contended)
	}
	// It won none of its keys (fewer than half): the Writer looks up
	// again, until the next contended claim.
	contended("a contended COPY after a claim by insert that won nothing", false, false)
	contended("a contended insert", true, false)
	for i := range sink.InsertRun {
		quiet(fmt.Sprintf("batch %d after the contended insert", i+1), true)
	}
	quiet(fmt.Sprintf("the batch after %d quiet inserts", sink.InsertRun), false)
	contended("a contended COPY, the other claim with another payload", false, true)
	contended("a contended insert, the other claim with another payload", true, true)
	// A batch whose keys were all claimed before (a re-read by a member
	// whose cache never saw them): by insert each costs two probes (the
	// insert's and its digest's read) where a look-up costs one, so the
	// Writer looks the next batch's keys up.
	reread := make([]uuid.UUID, 8)
	var ks []dedup.Key
	var ds []dedup.Digest
	for i := range reread {
		reread[i] = uuid.New()
		for _, h := range orders.Names {
			ks = append(ks, dedup.Key{EventID: reread[i], Handler: h})
			ds = append(ds, dedup.PayloadDigest(order(int64(i+1), "A")))
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := dedup.Claim(ctx, tx, schema, "kafka", "", ks, ds)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if res, err := write(reread...); err != nil || res.Applied != 0 || res.SkippedPostgres != len(ks) || res.Conflicts != 0 {
		t.Errorf("a re-read by insert: applied %d, skipped %d, conflicts %d, %v; want 0, %d, 0", res.Applied, res.SkippedPostgres, res.Conflicts, err, len(ks))
	}
	if insert, _ := byInsert(); !insert {
		t.Error("the re-read batch was claimed by look-up; want by insert (the Writer was inserting)")
	}
	quiet("the batch after a re-read by insert", false)
}

// waitBlockedBy waits until a session waits for hold, an open transaction
// that holds a key: only sessions hold blocks count, not the lock waits of
// other tests sharing the database.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, hold pgx.Tx) {
	t.Helper()
	var pid uint32
	if err := hold.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		if sinktest.Count(t, pool, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE %d = ANY(pg_blocking_pids(pid))`, pid)) > 0 {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("no session waited for the held key")
}
