package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/registry"
)

// The seed's order in the formats of -format: what a producer with a
// schema registry writes. Protobuf's user_id is an int32 (the ids are
// 1..1000): proto3's JSON mapping writes an int64 as a string, which the
// orders' parser does not take.
const (
	benchAvroOrder = `{"type":"record","name":"Order","namespace":"orders","fields":[
		{"name":"user_id","type":"long"},{"name":"items","type":{"type":"array","items":"string"}}]}`
	benchProtoOrder = "syntax = \"proto3\";\npackage orders;\nmessage Order { int32 user_id = 1; repeated string items = 2; }\n"
)

// formats is -format's: the stream's records re-encoded for a schema
// registry, and the decoder the members read them with.
type formats struct {
	format processor.Format
	enc    *registry.Encoder
	dec    *registry.Decoder
	stop   func()
}

// newFormats sets up -format: nothing for json; for avro and protobuf, a
// registry (-registry, or franz-go's srfake in this process) with the
// order's schema registered.
func newFormats(ctx context.Context, format, url string) (*formats, error) {
	f := &formats{format: processor.Format(format), stop: func() {}}
	var src registry.Source
	switch f.format {
	case processor.FormatJSON:
		return f, nil
	case processor.FormatAvro:
		src = registry.Source{Kind: registry.Avro, Text: benchAvroOrder}
	case processor.FormatProtobuf:
		src = registry.Source{Kind: registry.Protobuf, Text: benchProtoOrder}
	default:
		return nil, fmt.Errorf("-format %q: json, avro or protobuf", format)
	}
	if url == "" {
		fake := srfake.New()
		f.stop, url = fake.Close, fake.URL()
	}
	cfg := registry.Config{URL: url, Timeout: 10 * time.Second}
	var err error
	if f.enc, err = registry.NewEncoder(ctx, cfg, "bench-orders-value", src); err != nil {
		f.stop()
		return nil, fmt.Errorf("-format %s: %w", format, err)
	}
	if f.dec, err = registry.New(cfg); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

// encode returns msgs with their values in the format (the same slice for
// json).
func (f *formats) encode(msgs []orders.Message) ([]orders.Message, error) {
	if f == nil || f.enc == nil {
		return msgs, nil
	}
	out := make([]orders.Message, len(msgs))
	for i, m := range msgs {
		v, err := f.enc.Encode(m.Value)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", m.Value, err)
		}
		out[i] = orders.Message{ID: m.ID, Value: v}
	}
	return out, nil
}

// decode is the members' decode config.
func (f *formats) decode() processor.DecodeConfig {
	if f == nil || f.dec == nil {
		return processor.DecodeConfig{}
	}
	return processor.DecodeConfig{Format: f.format, Registry: f.dec}
}
