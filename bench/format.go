package bench

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/registry"
)

// Format is a payload format the scenarios run in besides JSON (see
// Config.Formats): every record's JSON value encoded by Encoder (framed
// for a schema registry, its schema registered) before the runs, and
// read by the members through Decoder, back into the JSON the handlers
// see.
type Format struct {
	Name    processor.Format // processor.FormatAvro or processor.FormatProtobuf
	Encoder *registry.Encoder
	Decoder *registry.Decoder
}

// FormatRatio compares a scenario's median run in a format with its
// median run in JSON.
type FormatRatio struct {
	Scenario string  `json:"scenario"`
	Format   string  `json:"format"`
	Rate     float64 `json:"events_per_sec"`
	JSONRate float64 `json:"json_events_per_sec"`
	Ratio    float64 `json:"ratio"`
}

// formatTopic is a format's stream: an embedded cluster of its own whose
// topic (Config.Topic, as JSON's) holds the records re-encoded.
type formatTopic struct {
	f Format
	k *kafkaTopic
}

// openFormats starts, for each of Config.Formats, an embedded cluster and
// produces the stream's records there with their values encoded. The
// caller closes them.
func (b *benchRun) openFormats(ctx context.Context) ([]*formatTopic, error) {
	var out []*formatTopic
	for _, f := range b.cfg.Formats {
		recs := make([]*kgo.Record, len(b.recs.recs))
		for i, r := range b.recs.recs {
			v, err := f.Encoder.Encode(r.Value)
			if err != nil {
				return out, fmt.Errorf("%s: encode payload %s: %w", f.Name, r.Value, err)
			}
			recs[i] = &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: v, Headers: r.Headers, Timestamp: r.Timestamp}
		}
		k, err := openKafka(ctx, b.cfg, b.id)
		if err != nil {
			return out, err
		}
		out = append(out, &formatTopic{f: f, k: k})
		if err := k.produce(ctx, recs); err != nil {
			return out, fmt.Errorf("%s: %w", f.Name, err)
		}
	}
	return out, nil
}

// formatRatios compares each format's scenarios with JSON's, from the
// summary's medians.
func formatRatios(res *Results, scenarios []string, formats []Format) []FormatRatio {
	med := map[string]float64{}
	for _, l := range res.Summary {
		med[l.Name] = l.EventsPerSec
	}
	var out []FormatRatio
	for _, sc := range scenarios {
		for _, f := range formats {
			r := FormatRatio{Scenario: sc, Format: string(f.Name), Rate: med[sc+"-"+string(f.Name)], JSONRate: med[sc]}
			if r.JSONRate > 0 {
				r.Ratio = r.Rate / r.JSONRate
			}
			out = append(out, r)
		}
	}
	return out
}
