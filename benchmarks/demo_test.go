package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/onceflow/onceflow/internal/orders"
)

// benchmarks/orders.jsonl, the payloads of `onceflow bench` on the
// demo's configs, is the seed's orders: the first 1 000 unique orders of
// internal/orders' generator (seed 1), one a line, each an order Parse
// accepts. Regenerate it from orders.Generate(1000, 0, 1) if the
// generator changes.
func TestDemoSampleIsTheSeedsOrders(t *testing.T) {
	got, err := os.ReadFile("orders.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	s, err := orders.Generate(1000, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for _, m := range s.Messages {
		if _, err := orders.Parse(m.Value); err != nil {
			t.Fatalf("generated order %s: %v", m.Value, err)
		}
		want = append(append(want, m.Value...), '\n')
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("orders.jsonl (%d bytes) is not orders.Generate(1000, 0, 1) (%d bytes)", len(got), len(want))
	}
}
