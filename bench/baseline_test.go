package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// topicHandler is a handler of one topic that records, per partition, the
// offsets it was given, whether each event was parsed, and the batches
// that were not of one partition in ascending offset order.
type topicHandler struct {
	name, topic string
	mu          sync.Mutex
	offsets     map[int32][]int64
	unparsed    int
	unordered   int
	wrongTopic  int
}

func (h *topicHandler) Name() string               { return h.name }
func (h *topicHandler) Consumes(topic string) bool { return topic == h.topic }
func (h *topicHandler) Apply(_ context.Context, _ pgx.Tx, evs []sink.Event) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, e := range evs {
		if i > 0 && (e.Partition != evs[0].Partition || e.Offset <= evs[i-1].Offset) {
			h.unordered++
		}
		if e.Topic != h.topic {
			h.wrongTopic++
		}
		h.offsets[e.Partition] = append(h.offsets[e.Partition], e.Offset)
		if e.Parsed != string(e.Value) {
			h.unparsed++
		}
	}
	return nil
}

// The raw-copy baseline writes the rows a claim writes — one per event and
// handler that consumes its topic, with the bus, no trace id, the
// payload's digest, in the current slice — and gives each handler its
// events parsed, in batches of one topic partition in offset order.
func TestRawCopyWritesTheClaimsRows(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	a := &topicHandler{name: "a", topic: "orders", offsets: map[int32][]int64{}}
	b := &topicHandler{name: "b", topic: "orders", offsets: map[int32][]int64{}}
	c := &topicHandler{name: "c", topic: "payments", offsets: map[int32][]int64{}}
	var evs []sink.Event
	const perPartition = 25
	// Interleaved partitions, and one partition's offsets descending:
	// each batch must still be of one partition, in offset order.
	for i := range 3 * perPartition {
		p := int32(i % 3)
		off := int64(i / 3)
		if p == 2 {
			off = perPartition - 1 - off
		}
		evs = append(evs, sink.Event{ID: uuid.New(), Value: []byte(fmt.Sprintf(`{"n":%d}`, i)), Topic: "orders", Partition: p, Offset: off})
	}
	// Another topic's partition 0, among them: its batches are its own.
	const payments = 10
	for i := range payments {
		at := 7 * i
		evs = slices.Insert(evs, at, sink.Event{ID: uuid.New(), Value: []byte(fmt.Sprintf(`{"p":%d}`, i)), Topic: "payments", Offset: int64(i)})
	}
	parse := func(e sink.Event) (any, error) { return string(e.Value), nil }
	if err := baseline(ctx, pool, schema, []sink.Handler{a, b, c}, evs, 10, 2, true, parse); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	rows, err := pool.Query(ctx, `SELECT event_id, handler, bus, trace_id IS NULL, payload_digest, slice FROM `+
		pgx.Identifier{schema, "processed_events"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	var id uuid.UUID
	var handler, bus string
	var noTrace bool
	var digest []byte
	var slice int32
	if _, err := pgx.ForEachRow(rows, []any{&id, &handler, &bus, &noTrace, &digest, &slice}, func() error {
		got[fmt.Sprintf("%s %s %s %v %x %d", id, handler, bus, noTrace, digest, slice)] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, e := range evs {
		d := dedup.PayloadDigest(e.Value)
		hs := []string{"a", "b"}
		if e.Topic == "payments" {
			hs = []string{"c"}
		}
		for _, h := range hs {
			want[fmt.Sprintf("%s %s kafka true %x 0", e.ID, h, d[:])] = true
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d processed_events rows, want %d", len(got), len(want))
	}
	for r := range want {
		if !got[r] {
			t.Errorf("no row %q", r)
		}
	}
	for _, h := range []*topicHandler{a, b, c} {
		if h.wrongTopic != 0 {
			t.Errorf("handler %s: given %d events of another topic", h.name, h.wrongTopic)
		}
		if h.unparsed != 0 {
			t.Errorf("handler %s: %d events not parsed", h.name, h.unparsed)
		}
		if h.unordered != 0 {
			t.Errorf("handler %s: %d events out of their batch's partition or offset order", h.name, h.unordered)
		}
		if h == c {
			continue
		}
		for p, offs := range h.offsets {
			slices.Sort(offs)
			want := make([]int64, perPartition)
			for i := range want {
				want[i] = int64(i)
			}
			if !slices.Equal(offs, want) {
				t.Errorf("handler %s partition %d: offsets %v, want 0…%d once each", h.name, p, offs, perPartition-1)
			}
		}
	}
	if got := c.offsets[0]; len(got) != payments || len(c.offsets) != 1 {
		t.Errorf("handler c was given %v, want partition 0's %d events of its topic", c.offsets, payments)
	}
}

// A payload the parser refuses fails the baseline, naming the event.
func TestBaselineParseError(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	id := uuid.New()
	evs := []sink.Event{{ID: id, Value: []byte(`{}`), Topic: "orders"}}
	parse := func(sink.Event) (any, error) { return nil, fmt.Errorf("no user_id") }
	h := &topicHandler{name: "a", topic: "orders", offsets: map[int32][]int64{}}
	err := baseline(t.Context(), pool, schema, []sink.Handler{h}, evs, 10, 2, true, parse)
	if err == nil || !strings.Contains(err.Error(), id.String()) || !strings.Contains(err.Error(), "no user_id") {
		t.Fatalf("baseline: %v, want the parse error naming event %s", err, id)
	}
}

// BenchmarkBaseline writes 200 000 unique orders of 12 partitions with the
// demo's emailHandler (on 2 and 4 writers) and with its four handlers (on
// 4), in batches of 1 000, as the effects-only and raw-copy baselines do;
// each iteration in a new schema. Besides the rate, it reports the CPU time per event of this
// process and of the pool's Postgres backends (from /proc, when Postgres
// runs here): the steadier figure on a machine shared with other work.
// Compare with benchmarks/ceiling on the same cluster:
//
//	go test -run '^$' -bench BenchmarkBaseline -benchtime 2x -count 3 ./bench
func BenchmarkBaseline(b *testing.B) {
	pool := sinktest.Pool(b)
	const n = 200_000
	evs := make([]sink.Event, n)
	for i := range evs {
		evs[i] = sink.Event{ID: uuid.New(), Topic: "orders", Partition: int32(i % 12), Offset: int64(i / 12),
			Value: fmt.Appendf(nil, `{"user_id":%d,"items":["sku-%d","sku-%d"]}`, 1+i%100000, i%500, (i*7)%500)}
	}
	for _, c := range []struct {
		claims   bool
		workers  int
		handlers []string
	}{
		{false, 2, []string{"emailHandler"}},
		{false, 4, []string{"emailHandler"}},
		{true, 2, []string{"emailHandler"}},
		{true, 4, []string{"emailHandler"}},
		{false, 4, []string{"emailHandler", "inventoryHandler", "analyticsHandler", "recommenderHandler"}},
		{true, 4, []string{"emailHandler", "inventoryHandler", "analyticsHandler", "recommenderHandler"}},
	} {
		claims, workers := c.claims, c.workers
		name := map[bool]string{false: "effects-only", true: "raw-copy"}[claims]
		b.Run(fmt.Sprintf("%s/handlers=%d/writers=%d", name, len(c.handlers), workers), func(b *testing.B) {
			var secs float64
			var goCPU, pgCPU time.Duration
			pgKnown := true
			for b.Loop() {
				b.StopTimer()
				schema := sinktest.Schema(b, pool, orders.Migrate)
				hs, err := orders.Handlers(schema, c.handlers...)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = pool.Exec(b.Context(), "CHECKPOINT") // not fatal: the role may lack pg_checkpoint
				pg0, ok0 := backendsCPU(b.Context(), pool)
				go0 := processCPU()
				b.StartTimer()
				start := time.Now()
				if err := baseline(b.Context(), pool, schema, hs, evs, 1000, workers, claims, orders.ParseEvent); err != nil {
					b.Fatal(err)
				}
				secs += time.Since(start).Seconds()
				b.StopTimer()
				goCPU += processCPU() - go0
				pg1, ok1 := backendsCPU(b.Context(), pool)
				pgCPU += pg1 - pg0
				pgKnown = pgKnown && ok0 && ok1
				b.StartTimer()
			}
			events := float64(b.N * n)
			b.ReportMetric(events/secs, "events/s")
			b.ReportMetric(float64(goCPU.Microseconds())/events, "go-µs/event")
			if pgKnown {
				b.ReportMetric(float64(pgCPU.Microseconds())/events, "pg-µs/event")
			}
		})
	}
}

// processCPU is this process's user and system time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendsCPU is the user and system time of pool's idle connections'
// backends, read from /proc (false when one cannot be read there).
func backendsCPU(ctx context.Context, pool *pgxpool.Pool) (time.Duration, bool) {
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var total time.Duration
	for _, c := range conns {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Conn().PgConn().PID()))
		if err != nil {
			return 0, false
		}
		// After the command's closing parenthesis, utime and stime are the
		// 12th and 13th fields, in clock ticks (100 a second).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return 0, false
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+st) * 10 * time.Millisecond
	}
	return total, true
}
