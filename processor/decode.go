package processor

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// HeaderEventID is the record header that carries the event id by default.
const HeaderEventID = wire.HeaderEventID

// DecodeConfig says where a record's event id is and how large a record may be.
type DecodeConfig struct {
	// IDField, when set, names a top-level string field of the JSON value
	// holding the event id; otherwise the id is the event_id header.
	IDField string
	// MaxBytes is the largest accepted value; 0 means no limit.
	MaxBytes int
}

// DecodeError is a record that cannot become an event. It is not retried:
// the record goes to dead letters with Reason.
type DecodeError struct {
	Topic     string
	Partition int32
	Offset    int64
	EventID   uuid.NullUUID // set when the id was readable but the value was not
	Reason    string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode %s/%d@%d: %s", e.Topic, e.Partition, e.Offset, e.Reason)
}

// Decode turns a record into an event: a UUID event id and a JSON value
// that Postgres can store (no NUL byte, no \u0000 escape). The error is a
// *DecodeError naming the problem.
func Decode(r *kgo.Record, cfg DecodeConfig) (sink.Event, error) {
	fail := func(id uuid.NullUUID, format string, args ...any) (sink.Event, error) {
		return sink.Event{}, &DecodeError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			EventID: id, Reason: fmt.Sprintf(format, args...)}
	}
	var id uuid.NullUUID
	if cfg.IDField == "" {
		raw, ok := header(r, HeaderEventID)
		if !ok {
			return fail(id, "no %s header", HeaderEventID)
		}
		u, err := parseID(raw)
		if err != nil {
			return fail(id, "%s header %q is not a UUID", HeaderEventID, truncate(raw))
		}
		id = uuid.NullUUID{UUID: u, Valid: true}
	}
	switch {
	case cfg.MaxBytes > 0 && len(r.Value) > cfg.MaxBytes:
		return fail(id, "value is %d bytes, over the %d-byte limit", len(r.Value), cfg.MaxBytes)
	case len(r.Value) == 0:
		return fail(id, "value is empty")
	case bytes.IndexByte(r.Value, 0) >= 0:
		return fail(id, "value contains a NUL byte")
	case !json.Valid(r.Value):
		return fail(id, "value is not valid JSON")
	case bytes.Contains(r.Value, []byte(`\u0000`)):
		return fail(id, `value contains \u0000, which Postgres cannot store`)
	}
	if cfg.IDField != "" {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(r.Value, &fields); err != nil {
			return fail(id, "value is not a JSON object, so it has no %q field", cfg.IDField)
		}
		raw, ok := fields[cfg.IDField]
		if !ok {
			return fail(id, "value has no %q field", cfg.IDField)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fail(id, "field %q is not a string", cfg.IDField)
		}
		u, err := parseID([]byte(s))
		if err != nil {
			return fail(id, "field %q = %q is not a UUID", cfg.IDField, truncate([]byte(s)))
		}
		id = uuid.NullUUID{UUID: u, Valid: true}
	}
	return sink.Event{
		ID: id.UUID, Value: r.Value, Key: r.Key,
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
	}, nil
}

// parseID accepts only the canonical 36-character form.
func parseID(b []byte) (uuid.UUID, error) {
	if len(b) != 36 {
		return uuid.UUID{}, fmt.Errorf("not 36 characters")
	}
	return uuid.ParseBytes(b)
}

func header(r *kgo.Record, key string) ([]byte, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

func truncate(b []byte) string {
	const max = 64
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
