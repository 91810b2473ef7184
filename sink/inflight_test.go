package sink_test

import (
	"context"
	"errors"
	"sync"
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

// gate holds the transaction of a batch of partition 0 open in its Apply
// until open is closed (closing arrived when the first one comes), or
// fails it with ctx's error.
type gate struct {
	arrived, open chan struct{}
	once          sync.Once
}

func newGate() *gate { return &gate{arrived: make(chan struct{}), open: make(chan struct{})} }

func (*gate) Name() string { return "gate" }

func (g *gate) Apply(ctx context.Context, _ pgx.Tx, events []sink.Event) error {
	if len(events) == 0 || events[0].Partition != 0 {
		return nil
	}
	g.once.Do(func() { close(g.arrived) })
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// inflightSetup is a Writer w that owns partitions 0 and 1 of "orders",
// and w2, another member's, that owns partition 2; both with the orders
// handlers and g, and each its cache.
type inflightSetup struct {
	pool   *pgxpool.Pool
	schema string
	w, w2  *sink.Writer
	epochs map[int32]int64
	g      *gate
	rec    *tracetest.SpanRecorder
}

func newInflightSetup(t *testing.T) *inflightSetup {
	pool := sinktest.Pool(t)
	s := &inflightSetup{pool: pool, schema: sinktest.Schema(t, pool, orders.Migrate), g: newGate(), rec: tracetest.NewSpanRecorder(),
		epochs: map[int32]int64{}}
	cache := func() *dedup.Cache {
		c, err := dedup.New(1000)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	s.w = writerWith(t, pool, s.schema, sink.Config{Handlers: []sink.Handler{s.g}, Cache: cache(),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.rec))})
	s.w2 = writerWith(t, pool, s.schema, sink.Config{Handlers: []sink.Handler{s.g}, Cache: cache()})
	for w, ps := range map[*sink.Writer][]int32{s.w: {0, 1}, s.w2: {2}} {
		leases, err := w.Take(t.Context(), "orders", ps)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			s.epochs[p] = leases[p].Epoch
		}
	}
	return s
}

// batch is the first batch of partition p: ids at offsets 0, 1, …, each
// an order of its own user and item (the handlers' rows of two events are
// not the same: no batch waits for another's counters).
func (s *inflightSetup) batch(p int32, ids ...uuid.UUID) *sink.Batch {
	evs := make([]sink.Event, len(ids))
	for i, id := range ids {
		evs[i] = sink.Event{ID: id, Value: order(int64(id.ID()), id.String()), Topic: "orders", Partition: p, Offset: int64(i)}
	}
	return &sink.Batch{Topic: "orders", Partition: p, Epoch: s.epochs[p], Fence: -1, NextOffset: int64(len(ids)), Events: evs}
}

// waitWaiting waits until a batch of w waits for another's transaction:
// in a sink.wait_inflight span, or (as before that span) in a statement of
// the schema that waits for a lock.
func (s *inflightSetup) waitWaiting(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, sp := range s.rec.Started() {
			if sp.Name() == "sink.wait_inflight" {
				return
			}
		}
		if sinktest.Count(t, s.pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, s.schema) > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no batch waited for the open transaction within 10s")
}

// once checks that each of ids has its email once.
func (s *inflightSetup) once(t *testing.T, ids ...uuid.UUID) {
	t.Helper()
	for _, id := range ids {
		if n, err := orders.EmailsSent(context.Background(), s.pool, s.schema, id); err != nil || n != 1 {
			t.Errorf("emails of %s: %d, %v; want 1", id, n, err)
		}
	}
}

type written struct {
	res sink.Result
	err error
}

func goWrite(ctx context.Context, w *sink.Writer, b *sink.Batch) <-chan written {
	c := make(chan written, 1)
	go func() {
		res, err := w.Write(ctx, b)
		c <- written{res, err}
	}()
	return c
}

// low and high are event ids whose claims sort first and last.
func lowHigh() (low, high uuid.UUID) {
	low, high = uuid.New(), uuid.New()
	low[0], high[0] = 0x00, 0xff
	return low, high
}

// A batch with an event that another open transaction of its Writer
// claims (a redelivery on another partition while the first delivery's
// batch is open) waits for that transaction before it claims anything, so
// it holds none of its other events meanwhile: another member's batch
// that needs one of them commits at once instead of queueing behind it.
// When the first transaction commits, the waiting batch finds the event in
// the cache and skips it. Before, its claim held the other event (claims
// are written in id order, the shared event last) while it waited in
// Postgres, and the other member's batch waited with it.
func TestWriteWaitsForItsOwnOpenClaimHoldingNothing(t *testing.T) {
	s := newInflightSetup(t)
	ctx := t.Context()
	hn := len(orders.Names) + 1
	y, e := lowHigh()

	first := goWrite(ctx, s.w, s.batch(0, e)) // e's first delivery, held open
	<-s.g.arrived
	second := goWrite(ctx, s.w, s.batch(1, e, y)) // e redelivered on partition 1, and y
	s.waitWaiting(t)

	other := goWrite(ctx, s.w2, s.batch(2, y)) // another member's batch with y
	select {
	case r := <-other:
		if r.err != nil || r.res.Applied != hn {
			t.Errorf("the other member's batch: applied %d, %v; want %d", r.res.Applied, r.err, hn)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other member's batch waited for the open transaction it shares no event with")
	}
	select {
	case r := <-first:
		t.Fatalf("the first delivery's batch ended before it was let go: %+v", r)
	case r := <-second:
		t.Fatalf("the redelivery's batch ended before the first delivery's: %+v", r)
	default:
	}

	close(s.g.open)
	if r := <-first; r.err != nil || r.res.Applied != hn {
		t.Fatalf("the first delivery's batch: applied %d, %v; want %d", r.res.Applied, r.err, hn)
	}
	r := <-second
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Applied != 0 || r.res.SkippedLRU != hn || r.res.SkippedPostgres != hn {
		t.Errorf("the redelivery's batch: applied %d, skipped %d by the cache and %d by Postgres; want 0, %d (e), %d (y)",
			r.res.Applied, r.res.SkippedLRU, r.res.SkippedPostgres, hn, hn)
	}
	s.once(t, e, y)
}

// When the transaction a batch waits for rolls back, the batch applies
// the event itself, once; the first batch's retry then skips it.
func TestWriteAppliesWhatTheTransactionItWaitedForRolledBack(t *testing.T) {
	s := newInflightSetup(t)
	hn := len(orders.Names) + 1
	y, e := lowHigh()

	ctx1, cancel1 := context.WithCancel(t.Context())
	first := goWrite(ctx1, s.w, s.batch(0, e))
	<-s.g.arrived
	second := goWrite(t.Context(), s.w, s.batch(1, e, y))
	s.waitWaiting(t)
	cancel1()
	if r := <-first; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the first batch, canceled: %+v; want context.Canceled", r)
	}
	r := <-second
	if r.err != nil || r.res.Applied != 2*hn {
		t.Fatalf("the batch that waited: applied %d, %v; want %d (e and y)", r.res.Applied, r.err, 2*hn)
	}
	close(s.g.open)
	res, err := s.w.Write(t.Context(), s.batch(0, e))
	if err != nil || res.Applied != 0 || res.SkippedLRU != hn {
		t.Errorf("the first batch again: applied %d, skipped %d by the cache, %v; want 0, %d", res.Applied, res.SkippedLRU, err, hn)
	}
	s.once(t, e, y)
}

// A batch that waits for another transaction ends with its context's
// error when the context ends first, having written nothing; the other
// transaction is not disturbed.
func TestWriteWaitingEndsWithItsContext(t *testing.T) {
	s := newInflightSetup(t)
	hn := len(orders.Names) + 1
	y, e := lowHigh()

	first := goWrite(t.Context(), s.w, s.batch(0, e))
	<-s.g.arrived
	ctx2, cancel2 := context.WithCancel(t.Context())
	second := goWrite(ctx2, s.w, s.batch(1, e, y))
	s.waitWaiting(t)
	cancel2()
	if r := <-second; !errors.Is(r.err, context.Canceled) || r.res.Applied != 0 {
		t.Fatalf("the waiting batch, canceled: applied %d, %v; want 0, context.Canceled", r.res.Applied, r.err)
	}
	if n, err := orders.EmailsSent(t.Context(), s.pool, s.schema, y); err != nil || n != 0 {
		t.Errorf("emails of y after the waiting batch was canceled: %d, %v; want 0", n, err)
	}
	close(s.g.open)
	if r := <-first; r.err != nil || r.res.Applied != hn {
		t.Fatalf("the first batch: applied %d, %v; want %d", r.res.Applied, r.err, hn)
	}
	s.once(t, e)
}
