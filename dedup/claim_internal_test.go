package dedup

import (
	"bytes"
	"slices"
	"testing"

	"github.com/google/uuid"
)

// binarySize is the length appendBinary writes: the COPY buffer is made
// that size once.
func TestClaimSetBinarySize(t *testing.T) {
	keys := []Key{{uuid.New(), "emailHandler"}, {uuid.New(), "h"}, {uuid.New(), "inventoryHandler"}}
	trace := "0af7651916cd43dd8448eb211c80319c"
	for _, tc := range []struct {
		name    string
		digests []Digest
		trace   string
		todo    []int
	}{
		{"no digests, no trace", nil, "", []int{0, 1, 2}},
		{"digests and trace", []Digest{PayloadDigest([]byte("a")), {}, PayloadDigest([]byte("c"))}, trace, []int{0, 1, 2}},
		{"some keys", []Digest{PayloadDigest([]byte("a"))}, trace, []int{2, 0}},
		{"none", nil, "", []int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClaimSet(keys, tc.digests, "kafka", tc.trace, 3)
			c.todo = tc.todo
			if got, want := c.binarySize(), len(c.appendBinary(nil)); got != want {
				t.Errorf("binarySize() = %d, want len(appendBinary) = %d", got, want)
			}
		})
	}
}

// newLookupKeys gives each distinct id once, and chains every key of an
// id from its first, in index order, wherever the keys are in the batch.
func TestLookupKeys(t *testing.T) {
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	keys := []Key{{a, "x"}, {b, "x"}, {a, "y"}, {a, "z"}, {c, "x"}, {b, "y"}, {a, "x"}}
	l := newLookupKeys(keys)
	var ids []uuid.UUID
	for _, id := range l.ids {
		ids = append(ids, id.Bytes)
	}
	slices.SortFunc(ids, func(x, y uuid.UUID) int { return slices.Compare(x[:], y[:]) })
	want := []uuid.UUID{a, b, c}
	slices.SortFunc(want, func(x, y uuid.UUID) int { return slices.Compare(x[:], y[:]) })
	if !slices.Equal(ids, want) {
		t.Errorf("ids = %v, want %v", ids, want)
	}
	for id, wantChain := range map[uuid.UUID][]int{a: {0, 2, 3, 6}, b: {1, 5}, c: {4}} {
		var chain []int
		for i, ok := l.first[id]; ok && i >= 0; i = l.next[i] {
			chain = append(chain, i)
		}
		if !slices.Equal(chain, wantChain) {
			t.Errorf("keys of %v: %v, want %v", id, chain, wantChain)
		}
	}
}

// compareIDs orders ids as bytes.Compare does.
func TestCompareIDs(t *testing.T) {
	ids := []uuid.UUID{{}, {0: 1}, {7: 1}, {8: 1}, {15: 1}, {0: 0xff}, {8: 0xff, 15: 1}, uuid.New(), uuid.New(), uuid.New()}
	for _, a := range ids {
		for _, b := range ids {
			if got, want := compareIDs(&a, &b), bytes.Compare(a[:], b[:]); got != want {
				t.Errorf("compareIDs(%v, %v) = %d, want %d", a, b, got, want)
			}
		}
	}
}

// BenchmarkDistinctKeys measures ordering a batch's 1000 keys (random
// ids, one handler) as a claim writes them.
func BenchmarkDistinctKeys(b *testing.B) {
	keys := make([]Key, 1000)
	for i := range keys {
		keys[i] = Key{EventID: uuid.New(), Handler: "emailHandler"}
	}
	for b.Loop() {
		distinctKeys(keys)
	}
}
