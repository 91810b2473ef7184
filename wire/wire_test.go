package wire_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/wire"
)

func TestNewRecord(t *testing.T) {
	id := uuid.MustParse("7f8a0000-0000-0000-0000-000000000001")
	r := wire.NewRecord("orders", id, []byte(`{"user_id":1,"items":["A"]}`))
	if r.Topic != "orders" || string(r.Key) != id.String() || string(r.Value) != `{"user_id":1,"items":["A"]}` {
		t.Errorf("record = %+v", r)
	}
	if got := (wire.RecordCarrier{Record: r}).Get(wire.HeaderEventID); got != id.String() {
		t.Errorf("%s header = %q, want %s", wire.HeaderEventID, got, id)
	}
}

// A span context injected into a record's headers is extracted unchanged,
// and injecting twice replaces the header instead of adding another.
func TestRecordCarrierRoundTrip(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	r := wire.NewRecord("orders", uuid.New(), []byte(`{}`))
	var p propagation.TraceContext
	p.Inject(ctx, wire.RecordCarrier{Record: r})
	p.Inject(ctx, wire.RecordCarrier{Record: r})
	if got := (wire.RecordCarrier{Record: r}).Keys(); !slices.Equal(got, []string{wire.HeaderEventID, "traceparent"}) {
		t.Errorf("headers = %v, want event_id and one traceparent", got)
	}
	got := trace.SpanContextFromContext(p.Extract(context.Background(), wire.RecordCarrier{Record: r}))
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() {
		t.Errorf("extracted %v, want %v", got, sc)
	}
}
