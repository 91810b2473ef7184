package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/onceflow/onceflow/internal/orders"
)

func testWorkload(t *testing.T, seed uint64) *workload {
	t.Helper()
	var all []string
	for _, k := range poisonKinds {
		all = append(all, k.Name)
	}
	w, err := newWorkload(seed, workloadConfig{Events: 2000, Duplicates: 0.5, OtherPartition: 0.3, Partitions: 6,
		Poison: all, PoisonScale: 2, MaxRecordBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestWorkloadReplaysFromItsSeed(t *testing.T) {
	a, b := testWorkload(t, 3), testWorkload(t, 3)
	if len(a.Records) != len(b.Records) {
		t.Fatalf("%d and %d records from one seed", len(a.Records), len(b.Records))
	}
	for i := range a.Records {
		ra, rb := a.Records[i], b.Records[i]
		if ra.Seq != rb.Seq || ra.Kind != rb.Kind || ra.ID != rb.ID || ra.Partition != rb.Partition || !bytes.Equal(ra.Value, rb.Value) {
			t.Fatalf("record %d differs between two workloads of one seed: %+v / %+v", i, ra.Kind, rb.Kind)
		}
	}
}

func TestWorkloadRecords(t *testing.T) {
	w := testWorkload(t, 5)
	kinds := map[string]int{}
	first := map[[16]byte]record{}
	elsewhere := 0
	for i, r := range w.Records {
		kinds[r.Kind]++
		if r.Seq != int64(i+1) {
			t.Fatalf("record %d has seq %d", i, r.Seq)
		}
		switch r.Kind {
		case kindOrder:
			if _, dup := first[r.ID]; dup {
				t.Fatalf("event %s published twice as an order", r.ID)
			}
			if _, err := orders.Parse(r.Value); err != nil || string(r.IDHeader) != r.ID.String() {
				t.Fatalf("order %s: %v", r.ID, err)
			}
			first[r.ID] = r
		case kindRedelivery:
			o, ok := first[r.ID]
			if !ok || !bytes.Equal(o.Value, r.Value) {
				t.Fatalf("redelivery %s is not the same id and payload as an earlier order", r.ID)
			}
			if o.Partition != r.Partition {
				elsewhere++
			}
		}
	}
	if kinds[kindOrder] != 2000 || kinds[kindRedelivery] != 1000 {
		t.Fatalf("%d orders and %d redeliveries, want 2000 and 1000", kinds[kindOrder], kinds[kindRedelivery])
	}
	if elsewhere == 0 || elsewhere == kinds[kindRedelivery] {
		t.Fatalf("%d of %d redeliveries on another partition, want some", elsewhere, kinds[kindRedelivery])
	}
	for _, k := range poisonKinds {
		if kinds[k.Name] != 2*k.Count {
			t.Errorf("%d records of poison %s, want %d", kinds[k.Name], k.Name, 2*k.Count)
		}
	}
}

// TestPoisonIsPoison checks each kind against the rule that makes it
// poison, independently of onceflow's decoder.
func TestPoisonIsPoison(t *testing.T) {
	const limit = 1 << 20
	w := testWorkload(t, 9)
	for _, r := range w.Records {
		if !r.poison() {
			continue
		}
		validID := r.IDHeader != nil && len(r.IDHeader) == 36 && r.hasID()
		var bad bool
		switch r.Kind {
		case "no-id":
			bad = r.IDHeader == nil
		case "bad-id":
			bad = r.IDHeader != nil && !validID
		case "bad-json":
			bad = validID && !json.Valid(r.Value)
		case "nul":
			bad = validID && bytes.IndexByte(r.Value, 0) >= 0
		case "nul-escape":
			bad = validID && json.Valid(r.Value) && bytes.Contains(r.Value, []byte(`\u0000`))
		case "empty":
			bad = validID && len(r.Value) == 0
		case "over-decoder":
			bad = validID && len(r.Value) > limit && json.Valid(r.Value)
		case "over-dlq":
			bad = r.IDHeader == nil && len(r.Value) > franzMaxRecord && len(r.Value) < limit && len(r.Value)+1024 < 1048588
		case "rejected":
			_, err := orders.Parse(r.Value)
			bad = validID && json.Valid(r.Value) && err != nil
		case "data-error":
			o, err := orders.Parse(r.Value)
			// 10000 characters drawn from many letters: Postgres cannot
			// compress the index entry under its limit.
			bad = validID && err == nil && slices.ContainsFunc(o.Items, func(it string) bool { return len(it) == 10000 && distinct(it) > 40 })
		}
		if !bad {
			t.Errorf("poison %s (seq %d, header %q, %d bytes) is not what its kind says", r.Kind, r.Seq, shorten(string(r.IDHeader)), len(r.Value))
		}
	}
}

func distinct(s string) int {
	seen := map[rune]bool{}
	for _, c := range s {
		seen[c] = true
	}
	return len(seen)
}
