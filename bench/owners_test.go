package bench

import (
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/processor"
)

// fakeMember runs the partitions it is given.
type fakeMember struct {
	mu sync.Mutex
	ps []int32
}

func (f *fakeMember) set(ps ...int32) { f.mu.Lock(); f.ps = ps; f.mu.Unlock() }
func (f *fakeMember) Partitions() []processor.PartitionState {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []processor.PartitionState
	for _, p := range f.ps {
		out = append(out, processor.PartitionState{Partition: p})
	}
	return out
}

// A restarted static member that gets back only part of what it held (a
// rebalance for another change gave the rest away) is measured once it
// runs partitions again: the rest count as moved. Until its new
// incarnation runs any, nothing is measured.
func TestRetakenCountsWhatDidNotComeBack(t *testing.T) {
	o := newOwners()
	m1, other := &fakeMember{}, &fakeMember{}
	o.add("m", m1)
	o.add("x", other)
	m1.set(0, 1)
	other.set(2)
	o.poll(time.Now())
	from := time.Now()
	m1.set() // killed
	o.poll(time.Now())
	m2 := &fakeMember{}
	o.add("m", m2) // restarted under its name, not yet running anything
	held := o.lastHeld("m")
	if len(held) != 2 {
		t.Fatalf("held %v, want [0 1]", held)
	}
	other.set(1, 2)
	o.poll(time.Now())
	if _, ok := o.retaken(t.Context(), "m", held, from, 100*time.Millisecond); ok {
		t.Fatalf("measured before the restarted member ran any partition")
	}
	m2.set(0)
	o.poll(time.Now())
	moved, ok := o.retaken(t.Context(), "m", held, from, 5*time.Second)
	if !ok || moved != 1 {
		t.Errorf("moved %d (%v), want partition 1 counted as moved", moved, ok)
	}
}
