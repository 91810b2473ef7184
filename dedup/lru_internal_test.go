package dedup

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// order lists l's ids from the most to the least recently added, walking
// the links both ways; it fails t when they disagree or miss an entry.
func (l *lru) order(t *testing.T) []byte {
	t.Helper()
	var fwd, back []byte
	for i := l.head; i >= 0; i = l.slots[i].next {
		fwd = append(fwd, l.slots[i].id[0])
	}
	for i := l.tail; i >= 0; i = l.slots[i].prev {
		back = append(back, l.slots[i].id[0])
	}
	slices.Reverse(back)
	if !slices.Equal(fwd, back) || len(fwd) != l.len() {
		t.Fatalf("links disagree: forward %v, backward reversed %v, %d in the map", fwd, back, l.len())
	}
	return fwd
}

// The store evicts the least recently added event: an add of an event
// present makes it the most recent, a peek does not, and a full store
// reuses the evicted event's slot.
func TestLRUOrder(t *testing.T) {
	id := func(b byte) uuid.UUID { return uuid.UUID{b} }
	for _, tc := range []struct {
		name string
		size int
		ops  string // a digit: add that id; p and a digit: peek it
		want string // ids most recent first
	}{
		{"one", 1, "12", "2"},
		{"under size", 3, "12", "21"},
		{"evicts the oldest", 3, "1234", "432"},
		{"an add refreshes", 3, "12314", "413"},
		{"a peek does not", 3, "123p14", "432"},
		{"re-add the head", 2, "1222", "21"},
		{"re-add the tail", 3, "1231", "132"},
		{"re-add the middle", 3, "1232", "231"},
		{"many evictions", 2, "123456789", "98"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLRU(tc.size)
			for i := 0; i < len(tc.ops); i++ {
				if tc.ops[i] == 'p' {
					i++
					l.peek(id(tc.ops[i] - '0'))
					continue
				}
				e, _ := l.add(id(tc.ops[i] - '0'))
				e.handlers = uint64(tc.ops[i] - '0')
			}
			got := l.order(t)
			want := []byte(tc.want)
			for i := range want {
				want[i] -= '0'
			}
			if !slices.Equal(got, want) {
				t.Fatalf("order %v, want %v", got, want)
			}
			if len(l.slots) > tc.size {
				t.Errorf("%d slots, size %d", len(l.slots), tc.size)
			}
			for _, b := range want {
				if e, ok := l.peek(id(b)); !ok || e.handlers != uint64(b) {
					t.Errorf("peek %d = %+v, %v; want its entry", b, e, ok)
				}
			}
		})
	}
}

// An add reports whether the event was there, and hands back its entry to
// update in place.
func TestLRUAdd(t *testing.T) {
	l := newLRU(2)
	a := uuid.New()
	e, ok := l.add(a)
	if ok || *e != (entry{}) {
		t.Fatalf("first add: %+v, %v; want a zero entry, not there", *e, ok)
	}
	e.handlers = 5
	if e, ok := l.add(a); !ok || e.handlers != 5 {
		t.Fatalf("second add: %+v, %v; want the entry, there", *e, ok)
	}
	l.add(uuid.New())
	l.add(uuid.New()) // evicts a
	if _, ok := l.peek(a); ok {
		t.Fatal("the least recently added event was not evicted")
	}
	if e, ok := l.add(a); ok || *e != (entry{}) {
		t.Fatalf("add after eviction: %+v, %v; want a zero entry (the reused slot cleared)", *e, ok)
	}
}

// A size the slots cannot number is refused, not wrapped.
func TestNewRefusesSizeBeyondSlots(t *testing.T) {
	n := int64(maxCacheSize) + 1
	if int64(int(n)) != n {
		t.Skip("int cannot hold it here")
	}
	if c, err := New(int(n)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("New(%d) = %v, %v; want an error naming the bound", n, c, err)
	}
}
