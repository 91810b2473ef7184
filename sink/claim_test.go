package sink_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// Every batch looks its keys up before claiming: the keys found are
// skipped with their stored digests — a conflicting duplicate among them
// is still refused — and the rest are claimed by a COPY that meets none of
// them. Effects are counted: exactly once throughout.
func TestWriteLooksUpFirst(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	rec := tracetest.NewSpanRecorder()
	w := writerWith(t, pool, schema, sink.Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	epoch := take(t, w)
	ids := make([]uuid.UUID, 7)
	for i := range ids {
		ids[i] = uuid.New()
	}
	a, b, c, d, e, f, g := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6]
	want := map[uuid.UUID]orders.Order{}
	for i, id := range ids {
		want[id] = orders.Order{UserID: int64(i + 1), Items: []string{"A"}}
	}
	val := func(id uuid.UUID) []byte { o := want[id]; return order(o.UserID, o.Items...) }
	next := int64(0)
	write := func(evs []uuid.UUID, values ...[]byte) sink.Result {
		t.Helper()
		vs := make([][]byte, len(evs))
		for i, id := range evs {
			vs[i] = val(id)
			if i < len(values) && values[i] != nil {
				vs[i] = values[i]
			}
		}
		fence := next
		if next == 0 {
			fence = -1
		}
		res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: fence,
			NextOffset: next + int64(len(evs)), Events: events(next, evs, vs)})
		if err != nil {
			t.Fatal(err)
		}
		next += int64(len(evs))
		return res
	}
	// foundFirst is the onceflow.found_first attribute of the last claim
	// span: -1 when the claim did not look up first.
	foundFirst := func() int64 {
		t.Helper()
		spans := rec.Ended()
		for i := len(spans) - 1; i >= 0; i-- {
			if spans[i].Name() != "dedup.claim" {
				continue
			}
			for _, kv := range spans[i].Attributes() {
				if kv.Key == "onceflow.found_first" {
					return kv.Value.AsInt64()
				}
			}
			return -1
		}
		t.Fatal("no dedup.claim span")
		return 0
	}
	hn := len(orders.Names)

	// copyConflicts is the number of claim COPYs that met a key present,
	// over the spans ended so far.
	copyConflicts := func() int64 {
		var n int64
		for _, sp := range rec.Ended() {
			for _, kv := range sp.Attributes() {
				if kv.Key == "onceflow.claim.copy_conflicts" {
					n += kv.Value.AsInt64()
				}
			}
		}
		return n
	}

	if res := write([]uuid.UUID{a, b, c}); res.Applied != 3*hn || foundFirst() != 0 {
		t.Fatalf("new batch: applied %d, found first %d; want %d, 0", res.Applied, foundFirst(), 3*hn)
	}
	if res := write([]uuid.UUID{a, b, c}); res.Applied != 0 || res.SkippedPostgres != 3*hn || foundFirst() != int64(3*hn) {
		t.Fatalf("redelivery: applied %d, skipped %d, found first %d; want 0, %d, %d",
			res.Applied, res.SkippedPostgres, foundFirst(), 3*hn, 3*hn)
	}
	// b now carries another payload; d is new: the look-up finds a, b and
	// c, the claim copies d's keys without meeting any of them.
	res := write([]uuid.UUID{a, b, c, d}, nil, order(99, "B"))
	if got := foundFirst(); got != int64(3*hn) {
		t.Errorf("a batch with duplicates: %d keys found first, want %d", got, 3*hn)
	}
	if res.Applied != hn || res.SkippedPostgres != 2*hn || res.Conflicts != 1 {
		t.Errorf("looked-up batch: applied %d, skipped %d, conflicts %d; want %d, %d, 1", res.Applied, res.SkippedPostgres, res.Conflicts, hn, 2*hn)
	}
	if res := write([]uuid.UUID{e, f, g}); res.Applied != 3*hn || foundFirst() != 0 {
		t.Errorf("new keys after duplicates: applied %d, found first %d; want %d, 0", res.Applied, foundFirst(), 3*hn)
	}
	if n := copyConflicts(); n != 0 {
		t.Errorf("%d claim COPYs met a key present; want none (the look-up found them first)", n)
	}
	rep, err := orders.Check(ctx, pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1 AND reason = $2`, b, sink.ReasonConflict); n != 1 {
		t.Errorf("conflict dead letters of b = %d, want 1", n)
	}
}

// statements records the SQL of every statement a pool runs, pipelined
// ones included.
type statements struct {
	mu   sync.Mutex
	sqls []string
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.sqls = append(s.sqls, d.SQL)
	s.mu.Unlock()
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The statements of a pipelined batch are recorded as well.
func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (s *statements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.mu.Lock()
	s.sqls = append(s.sqls, d.SQL)
	s.mu.Unlock()
}

func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// count returns how many recorded statements contain sub, and forgets them.
func (s *statements) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.sqls {
		if strings.Contains(q, sub) {
			n++
		}
	}
	s.sqls = nil
	return n
}

// A record twice in one batch loses its second claim to its first: the
// digest it is compared with is the first copy's, known without reading
// it back, so the batch reads digests once, in its look-up. A key claimed
// by an earlier batch is found by that look-up with its digest, and a
// second copy with another payload is still a conflict.
func TestWriteRepeatInBatchReadsNoDigest(t *testing.T) {
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(sinktest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	rec := &statements{}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	w := newWriter(t, pool, schema, nil)
	epoch := take(t, w)
	const digestRead = "SELECT event_id, handler, payload_digest"
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	rec.count("")
	res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 3,
		Events: events(0, []uuid.UUID{a, b, a}, [][]byte{order(1, "A"), order(2, "B"), order(1, "A")})})
	if err != nil {
		t.Fatal(err)
	}
	hn := len(orders.Names)
	if n := rec.count(digestRead); n != 1 || res.Applied != 2*hn || res.SkippedPostgres != hn {
		t.Errorf("a record twice: %d digest reads, applied %d, skipped %d; want 1 (the look-up), %d, %d", n, res.Applied, res.SkippedPostgres, 2*hn, hn)
	}
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: 3, NextOffset: 6,
		Events: events(3, []uuid.UUID{b, c, c}, [][]byte{order(2, "B"), order(3, "C"), order(4, "D")})})
	if err != nil {
		t.Fatal(err)
	}
	if n := rec.count(digestRead); n != 1 || res.Applied != hn || res.Conflicts != 1 {
		t.Errorf("b again, c twice with two payloads: %d digest reads, applied %d, conflicts %d; want 1 (the look-up, which finds b), %d, 1",
			n, res.Applied, res.Conflicts, hn)
	}
	rep, err := orders.Check(ctx, pool, schema, map[uuid.UUID]orders.Order{
		a: {UserID: 1, Items: []string{"A"}}, b: {UserID: 2, Items: []string{"B"}}, c: {UserID: 3, Items: []string{"C"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}
