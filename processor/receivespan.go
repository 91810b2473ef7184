package processor

import (
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// attrEventID is the span attribute that carries an event id: on each
// record's receive span and on the dedup.skip events of a batch span
// (package sink), so a search by tag in Jaeger finds where an event was
// received and skipped (its publish carries it as messaging.message.id).
const attrEventID = "onceflow.event_id"

// eventIDTag tags each record's receive span with its event id
// (attrEventID). The span is the one a tracing hook in
// Config.KafkaOptions (kotel) starts when the record is buffered and ends
// when a poll returns it, before the record is decoded: this hook, added
// after KafkaOptions, runs in between and reads the id where the decoder
// will (a header, the key, the offset, a JSON field), leaving the span
// untagged when the id is missing or not a UUID (the record becomes a
// dead letter). A transaction's marker (a control record) is no event:
// its span stays untagged. Without a recording span it costs a nil check.
type eventIDTag struct{ cfg DecodeConfig }

// OnFetchRecordBuffered implements kgo.HookFetchRecordBuffered.
func (h eventIDTag) OnFetchRecordBuffered(r *kgo.Record) {
	if r.Context == nil || r.Attrs.IsControl() {
		return
	}
	span := trace.SpanFromContext(r.Context)
	if !span.IsRecording() {
		return
	}
	var id uuid.NullUUID
	switch h.cfg.IDSource {
	case IDFromHeader:
		if raw, n := header(r, h.cfg.IDHeader); n == 1 {
			u, err := parseID(raw)
			id = uuid.NullUUID{UUID: u, Valid: err == nil}
		}
	case IDFromKey:
		u, err := parseID(r.Key)
		id = uuid.NullUUID{UUID: u, Valid: err == nil}
	case IDFromOffset:
		id = uuid.NullUUID{UUID: OffsetID(r.Topic, r.Partition, r.Offset), Valid: true}
	case IDFromField:
		if h.cfg.Format == FormatJSON && h.cfg.IDField != "" {
			id = fieldID(r.Value, h.cfg.IDField)
		}
	}
	if id.Valid {
		span.SetAttributes(attribute.String(attrEventID, id.UUID.String()))
	}
}
