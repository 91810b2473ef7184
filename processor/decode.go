package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// HeaderEventID is the record header that carries the event id by default.
const HeaderEventID = wire.HeaderEventID

// Format is how a record's value is read.
type Format string

const (
	// FormatJSON requires a JSON value that Postgres can store as jsonb: it
	// becomes the event's payload. A record whose value is not such JSON
	// is a dead letter. A value framed for a schema registry (JSON Schema
	// serializers: a zero byte and a 4-byte schema id before the JSON) is
	// read past its header.
	FormatJSON Format = "json"
	// FormatBytes takes the value as it is, unchecked (an empty or null
	// value included): SQL handlers see it as value bytea and a NULL
	// payload.
	FormatBytes Format = "bytes"
)

// IDSource is where a record's event id comes from. Whatever the source,
// the id is a UUID; it is the dedup key with the handler's name.
type IDSource string

const (
	// IDFromHeader reads the id from a header (DecodeConfig.IDHeader,
	// default event_id) holding a UUID in its canonical 36-character form.
	IDFromHeader IDSource = "header"
	// IDFromField reads the id from a top-level string field of the JSON
	// value (DecodeConfig.IDField); it needs FormatJSON.
	IDFromField IDSource = "field"
	// IDFromKey reads the id from the record key, a canonical UUID text.
	IDFromKey IDSource = "key"
	// IDFromOffset derives the id from where the record is, for topics
	// whose producers set no id: the UUIDv5 of "topic/partition/offset" in
	// [OffsetIDNamespace]. It dedups only redeliveries of the same record
	// (a consumer restarting, a rebalance, a replay): a producer that
	// sends the same event twice writes two records, with two ids, and
	// both apply. A topic deleted and created again restarts its offsets,
	// so its new records get the ids of the old ones and are skipped as
	// duplicates for as long as processed_events remembers them.
	IDFromOffset IDSource = "offset"
)

// OffsetIDNamespace is the UUIDv5 namespace of the ids IDFromOffset
// derives, itself the UUIDv5 of the URL
// https://github.com/onceflow/onceflow/event-id/offset:
// uuid.NewSHA1(OffsetIDNamespace, []byte("orders/3/42")) is the id of the
// record at offset 42 of partition 3 of topic orders.
var OffsetIDNamespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/onceflow/onceflow/event-id/offset"))

// OffsetID is the event id IDFromOffset gives the record at offset of
// partition of topic.
func OffsetID(topic string, partition int32, offset int64) uuid.UUID {
	return uuid.NewSHA1(OffsetIDNamespace, []byte(topic+"/"+strconv.FormatInt(int64(partition), 10)+"/"+strconv.FormatInt(offset, 10)))
}

// DecodeConfig says how a record's value is read, where its event id is
// and how large a record may be. The zero value reads JSON values with the
// id in the event_id header.
type DecodeConfig struct {
	// Format is how the value is read; default FormatJSON.
	Format Format
	// IDSource is where the id is; default IDFromField when IDField is
	// set, else IDFromHeader.
	IDSource IDSource
	// IDHeader names the header holding the id with IDFromHeader; default
	// HeaderEventID.
	IDHeader string
	// IDField names the top-level string field of the JSON value holding
	// the id with IDFromField.
	IDField string
	// MaxBytes is the largest accepted value; 0 means no limit.
	MaxBytes int
	// Registry reads the values of FormatAvro and FormatProtobuf (see
	// framed.go); required with them, unused otherwise.
	Registry *registry.Decoder
}

// withDefaults returns c with every zero value replaced by its default.
func (c DecodeConfig) withDefaults() DecodeConfig {
	if c.Format == "" {
		c.Format = FormatJSON
	}
	if c.IDSource == "" {
		c.IDSource = IDFromHeader
		if c.IDField != "" {
			c.IDSource = IDFromField
		}
	}
	if c.IDHeader == "" {
		c.IDHeader = HeaderEventID
	}
	return c
}

// Validate returns every problem with c (after defaults), each naming its
// field.
func (c DecodeConfig) Validate() error {
	c = c.withDefaults()
	var ps []error
	bad := func(format string, args ...any) { ps = append(ps, fmt.Errorf("processor: Decode."+format, args...)) }
	switch c.Format {
	case FormatJSON, FormatBytes:
	case FormatAvro, FormatProtobuf:
		if c.Registry == nil {
			bad("Registry is required with Format %s", c.Format)
		}
	default:
		bad("Format %q is not %s, %s, %s or %s", c.Format, FormatJSON, FormatBytes, FormatAvro, FormatProtobuf)
	}
	switch c.IDSource {
	case IDFromHeader, IDFromKey, IDFromOffset:
		if c.IDField != "" {
			bad("IDField %q is set but IDSource is %s", c.IDField, c.IDSource)
		}
	case IDFromField:
		if c.IDField == "" {
			bad("IDField is required with IDSource %s", c.IDSource)
		}
		if c.Format == FormatBytes {
			bad("IDSource %s needs Format %s, %s or %s, not %s", c.IDSource, FormatJSON, FormatAvro, FormatProtobuf, c.Format)
		}
	default:
		bad("IDSource %q is not one of %s, %s, %s, %s", c.IDSource, IDFromHeader, IDFromField, IDFromKey, IDFromOffset)
	}
	if c.MaxBytes < 0 {
		bad("MaxBytes %d is negative", c.MaxBytes)
	}
	return errors.Join(ps...)
}

// DecodeError is a record that cannot become an event. It is not retried:
// the record goes to dead letters with Reason.
type DecodeError struct {
	Topic     string
	Partition int32
	Offset    int64
	// EventID is set when the id could be read although the record is
	// refused: from its header or key, or from the JSON field as far as
	// the value parses (a value too large, with a NUL or a \u0000, or
	// invalid after the field). Its dead letter carries it, so that
	// `onceflow audit ID` finds it.
	EventID uuid.NullUUID
	Reason  string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode %s/%d@%d: %s", e.Topic, e.Partition, e.Offset, e.Reason)
}

// Decode is DecodeContext without a deadline of its own: a schema
// registry's requests are still bounded by its timeout.
func Decode(r *kgo.Record, cfg DecodeConfig) (sink.Event, error) {
	return DecodeContext(context.Background(), r, cfg)
}

// DecodeContext turns a record into an event: a UUID event id from cfg's
// source and, with FormatJSON, a JSON value that Postgres can store (no
// NUL byte, no \u0000 escape) — with FormatAvro and FormatProtobuf, the
// JSON the registry's schema makes of the framed value; the record's key,
// headers and timestamp are carried along. cfg takes its defaults; it must
// be valid (see [DecodeConfig.Validate]), an invalid one rejects every
// record. A record that cannot become an event is a *DecodeError naming
// the problem. Any other error is the schema registry's, not the record's
// (registry.IsTransient: retry; registry.IsAuth: configuration), or ctx's.
func DecodeContext(ctx context.Context, r *kgo.Record, cfg DecodeConfig) (sink.Event, error) {
	return decodeRecord(ctx, r, cfg.withDefaults(), nil)
}

// decodeRecord is DecodeContext with cfg's defaults taken. The event's
// headers are carved from the end of *slab when it has room for them (a
// batch's records share one allocation), else allocated.
func decodeRecord(ctx context.Context, r *kgo.Record, cfg DecodeConfig, slab *[]sink.Header) (sink.Event, error) {
	fail := func(id uuid.NullUUID, format string, args ...any) (sink.Event, error) {
		if !id.Valid && cfg.IDSource == IDFromField && cfg.IDField != "" && cfg.Format == FormatJSON {
			id = fieldID(r.Value, cfg.IDField)
		}
		return sink.Event{}, &DecodeError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			EventID: id, Reason: fmt.Sprintf(format, args...)}
	}
	var id uuid.NullUUID
	switch cfg.IDSource {
	case IDFromHeader:
		raw, n := header(r, cfg.IDHeader)
		switch {
		case n == 0:
			return fail(id, "no %s header", cfg.IDHeader)
		case n > 1:
			return fail(id, "%d %s headers: the event id is ambiguous", n, cfg.IDHeader)
		}
		u, err := parseID(raw)
		if err != nil {
			return fail(id, "%s header %q is not a UUID", cfg.IDHeader, truncate(raw))
		}
		id = uuid.NullUUID{UUID: u, Valid: true}
	case IDFromKey:
		if len(r.Key) == 0 {
			return fail(id, "no record key (decode.event_id_source is key)")
		}
		u, err := parseID(r.Key)
		if err != nil {
			return fail(id, "record key %q is not a UUID", truncate(r.Key))
		}
		id = uuid.NullUUID{UUID: u, Valid: true}
	case IDFromOffset:
		id = uuid.NullUUID{UUID: OffsetID(r.Topic, r.Partition, r.Offset), Valid: true}
	case IDFromField:
		if cfg.IDField == "" {
			return fail(id, "event id source %s names no field", IDFromField)
		}
		// read from the value below, once it is known to be JSON
	default:
		return fail(id, "unknown event id source %q", cfg.IDSource)
	}
	if cfg.MaxBytes > 0 && len(r.Value) > cfg.MaxBytes {
		return fail(id, "value is %d bytes, over the %d-byte limit", len(r.Value), cfg.MaxBytes)
	}
	value := r.Value // the event's: the record's, or the JSON of a framed one
	switch cfg.Format {
	case FormatAvro, FormatProtobuf:
		v, reason, err := decodeFramed(ctx, cfg, r.Value)
		if err != nil {
			return sink.Event{}, err
		}
		if reason != "" {
			return fail(id, "%s", reason)
		}
		value = v
	case FormatBytes:
		if cfg.IDSource == IDFromField {
			return fail(id, "event id source %s needs format %s", IDFromField, FormatJSON)
		}
	case FormatJSON:
		value = unframeJSON(value)
		switch {
		case len(value) == 0:
			return fail(id, "value is empty")
		case bytes.IndexByte(value, 0) >= 0:
			return fail(id, "value contains a NUL byte")
		case !json.Valid(value):
			return fail(id, "value is not valid JSON")
		case wire.HasNULEscape(value):
			return fail(id, `value contains \u0000, which Postgres cannot store`)
		}
	default:
		return fail(id, "unknown format %q", cfg.Format)
	}
	if cfg.IDSource == IDFromField {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(value, &fields); err != nil {
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
	var hs []sink.Header
	if n := len(r.Headers); n > 0 {
		if slab != nil && cap(*slab)-len(*slab) >= n {
			at := len(*slab)
			*slab = (*slab)[:at+n]
			hs = (*slab)[at : at+n : at+n] // full: an append by a handler copies
		} else {
			hs = make([]sink.Header, n)
		}
		for i, h := range r.Headers {
			hs[i] = sink.Header{Key: h.Key, Value: h.Value}
		}
	}
	return sink.Event{
		ID: id.UUID, Value: value, Key: r.Key, Headers: hs,
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
	}, nil
}

// fieldID reads the id of a value the decoder refuses (too large, a NUL,
// invalid JSON further on) from its top-level field, as far as the value
// parses: the field's last occurrence before the value stops parsing, if
// it is a canonical UUID string. It reads the value token by token, so a
// value too large costs one pass and no copy of it.
func fieldID(value []byte, field string) uuid.NullUUID {
	dec := json.NewDecoder(bytes.NewReader(value))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return uuid.NullUUID{}
	}
	var id uuid.NullUUID
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			return id
		}
		if key != field {
			if skipValue(dec) != nil {
				return id
			}
			continue
		}
		var s string
		if err := dec.Decode(&s); err != nil {
			return uuid.NullUUID{} // not a string: the last occurrence is no id
		}
		u, err := parseID([]byte(s))
		id = uuid.NullUUID{UUID: u, Valid: err == nil}
	}
	return id
}

// skipValue reads past the next JSON value of dec without keeping it.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// parseID accepts only the canonical 36-character form.
func parseID(b []byte) (uuid.UUID, error) {
	if len(b) != 36 {
		return uuid.UUID{}, fmt.Errorf("not 36 characters")
	}
	return uuid.ParseBytes(b)
}

// header returns the value of r's header key and how many headers have
// that key (the value is the first one's).
func header(r *kgo.Record, key string) ([]byte, int) {
	var v []byte
	n := 0
	for _, h := range r.Headers {
		if h.Key == key {
			if n == 0 {
				v = h.Value
			}
			n++
		}
	}
	return v, n
}

func truncate(b []byte) string {
	const max = 64
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
