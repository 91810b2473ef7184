package main

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/registry"
)

// -formats runs json first whatever the order given, names each framed
// run after its format, and compares each with json's run of the scenario.
func TestFormatSet(t *testing.T) {
	set, err := newFormatSet(t.Context(), "protobuf,json,avro,json", "json", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stopFormats(set)
	var names []string
	for _, f := range set {
		names = append(names, formatRunName("steady", f))
	}
	if got := strings.Join(names, ","); got != "steady,steady-protobuf,steady-avro" {
		t.Fatalf("runs %s, want steady,steady-protobuf,steady-avro", got)
	}
	rs := formatRatios([]string{"steady"}, set, map[string]float64{"steady": 100, "steady-avro": 95, "steady-protobuf": 80})
	if len(rs) != 2 || rs[0] != (Ratio{"steady-protobuf", "steady", 0.8}) || rs[1] != (Ratio{"steady-avro", "steady", 0.95}) {
		t.Fatalf("ratios %+v", rs)
	}
	// Each framed format's records decode to the order they encode.
	stream, err := orders.Generate(50, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range set[1:] {
		msgs, err := f.encode(stream.Messages)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range msgs {
			v, err := f.dec.Decode(t.Context(), registryKind(f.format), m.Value)
			if err != nil {
				t.Fatalf("%s: %v", f.format, err)
			}
			got, err := orders.Parse(v)
			want, _ := orders.Parse(stream.Messages[i].Value)
			if err != nil || got.UserID != want.UserID || strings.Join(got.Items, ",") != strings.Join(want.Items, ",") {
				t.Fatalf("%s: %s decodes to %+v (%v), want %+v", f.format, stream.Messages[i].Value, got, err, want)
			}
		}
	}
	if _, err := newFormatSet(t.Context(), "json,xml", "json", ""); err == nil {
		t.Error("-formats json,xml: no error")
	}
}

func registryKind(f processor.Format) registry.Kind { return registry.Kind(f) }
