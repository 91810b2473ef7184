package main

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestSpanRecorder(t *testing.T) {
	rec := newSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tp.Tracer("test")
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	span := func(name string, d time.Duration) {
		_, s := tr.Start(t.Context(), name, trace.WithTimestamp(at))
		s.End(trace.WithTimestamp(at.Add(d)))
	}
	for range 2 {
		span(batchSpan, 100*time.Millisecond)
	}
	for _, d := range []time.Duration{1, 2, 3, 4, 10} {
		span("dedup.claim", d*time.Millisecond)
	}

	got := rec.take()
	want := []SpanStat{
		{Name: batchSpan, Count: 2, MeanMs: 100, P50Ms: 100, P95Ms: 100, TotalMs: 200, PerBatchMs: 100},
		{Name: "dedup.claim", Count: 5, MeanMs: 4, P50Ms: 3, P95Ms: 10, TotalMs: 20, PerBatchMs: 10},
	}
	if len(got) != len(want) {
		t.Fatalf("take() = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("take()[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if again := rec.take(); len(again) != 0 {
		t.Errorf("second take() = %+v, want nothing: take forgets what it returned", again)
	}
}

func TestSpanStatsWithoutBatches(t *testing.T) {
	got := spanStats(map[string][]time.Duration{"sink.commit": {time.Millisecond}})
	if len(got) != 1 || got[0].PerBatchMs != 0 || got[0].Count != 1 {
		t.Errorf("spanStats = %+v, want one row with no per-batch figure", got)
	}
}

func TestSQLLabel(t *testing.T) {
	for _, c := range []struct{ name, sql, want string }{
		{"begin", "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = 5000", "BEGIN"},
		{"claim insert", `INSERT INTO "s"."processed_events_s0" (event_id, handler) SELECT k.event_id FROM unnest($1::uuid[]) AS k`, "INSERT processed_events_s0"},
		{"advisory lock", `SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`, "SELECT pg_advisory_xact_lock_shared"},
		{"current slice", `SELECT max(slice), min(slice) FROM "s"."processed_events_slices"`, "SELECT processed_events_slices"},
		{"join past a function", "SELECT k.i, p.payload_digest\nFROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS k(event_id, handler, i)\nJOIN \"s\".\"processed_events\" p ON true", "SELECT processed_events"},
		{"offset cas", `UPDATE "s"."sink_offsets" SET next_offset = $4`, "UPDATE sink_offsets"},
		{"commit", "commit", "COMMIT"},
		{"empty", "  ", "?"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := sqlLabel(c.sql); got != c.want {
				t.Errorf("sqlLabel(%q) = %q, want %q", c.sql, got, c.want)
			}
		})
	}
}
