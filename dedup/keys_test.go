package dedup

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// distinctKeys keeps each key's first copy, in (event_id, handler) byte
// order, whatever order and repeats the batch has.
func TestDistinctKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	handlers := []string{"b", "a", "Émail", "émail", "Z"}
	var keys []Key
	first := map[Key]int{}
	for i := range 3000 {
		var k Key
		k.EventID[0], k.EventID[15] = byte(r.IntN(40)), byte(r.IntN(3))
		k.Handler = handlers[r.IntN(len(handlers))]
		if _, ok := first[k]; !ok {
			first[k] = i
		}
		keys = append(keys, k)
	}
	got := distinctKeys(keys)
	if len(got) != len(first) {
		t.Fatalf("%d distinct keys, want %d", len(got), len(first))
	}
	for j, i := range got {
		if first[keys[i]] != i {
			t.Fatalf("key %v at index %d, want its first copy %d", keys[i], i, first[keys[i]])
		}
		if j == 0 {
			continue
		}
		p := keys[got[j-1]]
		c := bytes.Compare(p.EventID[:], keys[i].EventID[:])
		if c > 0 || (c == 0 && strings.Compare(p.Handler, keys[i].Handler) >= 0) {
			t.Fatalf("%v sorts before %v", p, keys[i])
		}
	}
}
