package processor

import (
	"context"
	"errors"

	"github.com/onceflow/onceflow/registry"
)

// Formats of values framed for a schema registry (the Confluent wire
// format), read through DecodeConfig.Registry into JSON. The event's value
// is that JSON — a SQL handler's payload — and IDFromField reads the id
// from it.
const (
	// FormatAvro reads Avro by the writer schema the value's schema id
	// names.
	FormatAvro Format = "avro"
	// FormatProtobuf reads Protobuf: the message the value's schema id and
	// message index name.
	FormatProtobuf Format = "protobuf"
)

// decodeFramed reads a framed value. It returns its JSON; or, for a value
// that can never be read (not framed, an unknown schema id, a body that
// does not match its schema), the dead letter's reason, naming the schema
// id and subject; or the registry's error (transient or auth), which is no
// reason to dead-letter the record.
func decodeFramed(ctx context.Context, cfg DecodeConfig, value []byte) (json []byte, reason string, err error) {
	if cfg.Registry == nil {
		return nil, "format " + string(cfg.Format) + " needs a schema registry (DecodeConfig.Registry)", nil
	}
	v, err := cfg.Registry.Decode(ctx, registry.Kind(cfg.Format), value)
	var de *registry.DataError
	if errors.As(err, &de) {
		return nil, de.Error(), nil
	}
	return v, "", err
}

// unframeJSON returns v without the Confluent header (a zero magic byte and
// a 4-byte schema id) that JSON Schema serializers put before the JSON
// text, which never starts with a zero byte: FormatJSON takes a JSON value
// framed or not. The schema id is not looked up: the JSON describes
// itself.
func unframeJSON(v []byte) []byte {
	if len(v) > 5 && v[0] == 0 {
		return v[5:]
	}
	return v
}
