package main

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/exaring/otelpgx"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// SpanStat is the durations of the spans of one name ended during a run
// (-spans). Spans nest (a handler's span holds its "query INSERT …" span;
// onceflow.batch holds them all), so the rows do not add up.
type SpanStat struct {
	Name    string  `json:"name"`
	Count   int     `json:"count"`
	MeanMs  float64 `json:"mean_ms"`
	P50Ms   float64 `json:"p50_ms"`
	P95Ms   float64 `json:"p95_ms"`
	TotalMs float64 `json:"total_ms"`
	// PerBatchMs is TotalMs over the run's onceflow.batch spans: the time
	// an average batch spends in spans of this name.
	PerBatchMs float64 `json:"per_batch_ms"`
}

// batchSpan is the processor's span of one batch, from decode to the
// Kafka mark; spanStats divides totals by the number of them.
const batchSpan = "onceflow.batch"

// spanRecorder is an sdktrace.SpanProcessor that keeps the duration of
// every ended span by name, nothing else. It is safe for concurrent use.
type spanRecorder struct {
	mu   sync.Mutex
	durs map[string][]time.Duration
}

func newSpanRecorder() *spanRecorder { return &spanRecorder{durs: map[string][]time.Duration{}} }

func (r *spanRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (r *spanRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	d := s.EndTime().Sub(s.StartTime())
	r.mu.Lock()
	r.durs[s.Name()] = append(r.durs[s.Name()], d)
	r.mu.Unlock()
}

func (r *spanRecorder) Shutdown(context.Context) error   { return nil }
func (r *spanRecorder) ForceFlush(context.Context) error { return nil }

// take returns the statistics of the spans ended since the last take,
// sorted by total time, longest first, and forgets them.
func (r *spanRecorder) take() []SpanStat {
	r.mu.Lock()
	durs := r.durs
	r.durs = map[string][]time.Duration{}
	r.mu.Unlock()
	return spanStats(durs)
}

// spanStats aggregates durations by span name; PerBatchMs divides by the
// number of batchSpan spans (0 when there are none).
func spanStats(durs map[string][]time.Duration) []SpanStat {
	batches := len(durs[batchSpan])
	out := make([]SpanStat, 0, len(durs))
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for name, ds := range durs {
		if len(ds) == 0 {
			continue
		}
		s := slices.Clone(ds)
		slices.Sort(s)
		var total time.Duration
		for _, d := range s {
			total += d
		}
		st := SpanStat{Name: name, Count: len(s), TotalMs: ms(total), MeanMs: ms(total) / float64(len(s)),
			P50Ms: ms(s[min(len(s)-1, len(s)/2)]), P95Ms: ms(s[min(len(s)-1, len(s)*95/100)])}
		if batches > 0 {
			st.PerBatchMs = st.TotalMs / float64(batches)
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b SpanStat) int {
		if a.TotalMs != b.TotalMs {
			if a.TotalMs > b.TotalMs {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// newSpanTracing returns a TracerProvider that feeds rec only (no
// exporter), and the pgx tracer over it whose spans name each statement
// by sqlLabel ("query INSERT emails_sent", "batch query SELECT
// pg_advisory_xact_lock_shared").
func newSpanTracing(rec *spanRecorder) (*sdktrace.TracerProvider, *otelpgx.Tracer) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pt := otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithQuerySpanNamePrefix(),
		otelpgx.WithSpanNameCtxFunc(func(_ context.Context, sql string) string { return sqlLabel(sql) }),
		otelpgx.WithDisableSQLStatementInAttributes(), otelpgx.WithDisableConnectionDetailsInAttributes())
	return tp, pt
}

// sqlLabel names a statement by its first word and the table it works on
// (the first name after INTO, UPDATE, FROM or JOIN that is not a function
// call, without its schema), or for a SELECT of no table the function it
// calls: low-cardinality names that still tell the batch's statements
// apart.
func sqlLabel(sql string) string {
	words := strings.Fields(sql)
	if len(words) == 0 {
		return "?"
	}
	op := strings.ToUpper(words[0])
	switch op {
	case "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "SET":
		return op
	}
	for i := 0; i+1 < len(words); i++ {
		switch strings.ToUpper(words[i]) {
		case "INTO", "UPDATE", "FROM", "JOIN":
			name := words[i+1]
			if strings.Contains(name, "(") {
				continue
			}
			return op + " " + unqualified(name)
		}
	}
	if op == "SELECT" && len(words) > 1 {
		fn, _, _ := strings.Cut(words[1], "(")
		return op + " " + fn
	}
	return op
}

// unqualified is the last part of a possibly schema-qualified, possibly
// quoted name.
func unqualified(name string) string {
	name = strings.TrimRight(name, ",;")
	if i := strings.LastIndex(name, "."); i >= 0 {
		name = name[i+1:]
	}
	return strings.Trim(name, `"`)
}
