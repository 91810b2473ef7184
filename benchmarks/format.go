package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
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
	if f.enc, err = registry.NewEncoder(ctx, cfg, "bench-orders-"+format+"-value", src); err != nil {
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

// newFormatSet sets up -formats: each format of list (comma-separated,
// json first if present), with its own registry subject and decoder. An
// empty list is -format alone.
func newFormatSet(ctx context.Context, list, single, url string) ([]*formats, error) {
	if list == "" {
		f, err := newFormats(ctx, single, url)
		if err != nil {
			return nil, err
		}
		return []*formats{f}, nil
	}
	var set []*formats
	seen := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if seen[name] {
			continue
		}
		seen[name] = true
		f, err := newFormats(ctx, name, url)
		if err != nil {
			stopFormats(set)
			return nil, fmt.Errorf("-formats: %w", err)
		}
		set = append(set, f)
	}
	slices.SortStableFunc(set, func(a, b *formats) int {
		return cmp.Compare(boolRank(a.format != processor.FormatJSON), boolRank(b.format != processor.FormatJSON))
	})
	return set, nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func stopFormats(set []*formats) {
	for _, f := range set {
		f.stop()
	}
}

// formatRunName is the name of scenario's run in format f: the scenario's for
// json, scenario-avro and scenario-protobuf for the others.
func formatRunName(scenario string, f *formats) string {
	if f.format == processor.FormatJSON {
		return scenario
	}
	return scenario + "-" + string(f.format)
}

// scenarioInFormats runs scenario once in each format of set, one after
// the other, so that a round holds every format's run of it side by side.
func (b *bench) scenarioInFormats(ctx context.Context, scenario string, set []*formats) ([]*Run, error) {
	defer func(f *formats) { b.formats = f }(b.formats)
	var out []*Run
	for _, f := range set {
		b.formats = f
		r, err := b.scenario(ctx, scenario)
		if err != nil {
			return nil, fmt.Errorf("format %s: %w", f.format, err)
		}
		r.Name = formatRunName(r.Name, f)
		out = append(out, r)
	}
	return out, nil
}

// formatRatios compares each scenario's run in a framed format with its
// json run of the same rounds: the price of decoding through a registry.
func formatRatios(scenarios []string, set []*formats, rates map[string]float64) []Ratio {
	var out []Ratio
	for _, s := range scenarios {
		for _, f := range set {
			if name := formatRunName(s, f); name != s && rates[s] > 0 {
				out = append(out, Ratio{Scenario: name, Baseline: s, Ratio: rates[name] / rates[s]})
			}
		}
	}
	return out
}

// writeFormatRatios adds the -formats comparison to results.md.
func writeFormatRatios(b *strings.Builder, rep *Report) {
	if len(rep.FormatRatios) == 0 {
		return
	}
	b.WriteString("\nEach format against JSON in the same rounds (medians; every round above), the target ≥ 0.90×:\n\n| run | vs | ratio |\n|---|---|---:|\n")
	for _, x := range rep.FormatRatios {
		fmt.Fprintf(b, "| %s | %s | %.2f× |\n", x.Scenario, x.Baseline, x.Ratio)
	}
}
