package sink_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// skipLines collects the dedup.skip records of a logger at its level.
type skipLines struct {
	level slog.Level
	mu    sync.Mutex
	recs  []slog.Record
}

func (h *skipLines) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *skipLines) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "dedup.skip" {
		h.mu.Lock()
		h.recs = append(h.recs, r.Clone())
		h.mu.Unlock()
	}
	return nil
}
func (h *skipLines) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *skipLines) WithGroup(string) slog.Handler      { return h }

// A batch's skipped keys are logged as dedup.skip, the first SkipLogLimit
// at Info and the rest at Debug, each naming its event, handler and
// offset, and the first SkipEventLimit are events of the batch's span
// when it records: whatever the logger's level, and whether or not a
// span records, each line and event that is enabled is there.
func TestSkipsLoggedAndTraced(t *testing.T) {
	pool := sinktest.Pool(t)
	hn := len(orders.Names)
	for _, tc := range []struct {
		name       string
		level      slog.Level
		recording  bool
		info, dbg  int // lines wanted at Info and at Debug
		spanEvents int
	}{
		{"debug, recording", slog.LevelDebug, true, 3, 2*hn - 3, 5},
		{"info, recording", slog.LevelInfo, true, 3, 0, 5},
		{"warn, recording", slog.LevelWarn, true, 0, 0, 5},
		{"debug, not recording", slog.LevelDebug, false, 3, 2*hn - 3, 0},
		{"warn, not recording", slog.LevelWarn, false, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := sinktest.Schema(t, pool, orders.Migrate)
			lines := &skipLines{level: tc.level}
			w := writerWith(t, pool, schema, sink.Config{Logger: slog.New(lines), SkipLogLimit: 3, SkipEventLimit: 5})
			epoch := take(t, w)
			a, b := uuid.New(), uuid.New()
			vs := [][]byte{order(1, "A"), order(2, "B")}
			if _, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 2,
				Events: events(0, []uuid.UUID{a, b}, vs)}); err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			rec := tracetest.NewSpanRecorder()
			if tc.recording {
				ctx, _ = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test").Start(ctx, "batch")
			}
			// The same records again: every key is found in Postgres.
			res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: 2, NextOffset: 4,
				Events: events(2, []uuid.UUID{a, b}, vs)})
			if err != nil {
				t.Fatal(err)
			}
			if res.SkippedPostgres != 2*hn {
				t.Fatalf("skipped %d keys in Postgres, want %d", res.SkippedPostgres, 2*hn)
			}
			var info, dbg int
			for _, r := range lines.recs {
				switch r.Level {
				case slog.LevelInfo:
					info++
				case slog.LevelDebug:
					dbg++
				}
				attrs := map[string]string{}
				r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
				if id := attrs["event_id"]; id != a.String() && id != b.String() {
					t.Errorf("dedup.skip with event_id %q, want %s or %s", id, a, b)
				}
				if attrs["handler"] == "" || attrs["layer"] != "postgres" || attrs["offset"] == "" || attrs["step"] != "dedup.skip" {
					t.Errorf("dedup.skip line %v: want its handler, layer postgres, offset and step", attrs)
				}
			}
			if info != tc.info || dbg != tc.dbg {
				t.Errorf("dedup.skip lines: %d at Info, %d at Debug; want %d, %d", info, dbg, tc.info, tc.dbg)
			}
			if tc.recording {
				trace.SpanFromContext(ctx).End()
			}
			events := 0
			for _, sp := range rec.Ended() {
				for _, ev := range sp.Events() {
					if ev.Name == "dedup.skip" {
						events++
					}
				}
			}
			if events != tc.spanEvents {
				t.Errorf("%d dedup.skip span events, want %d", events, tc.spanEvents)
			}
		})
	}
}
