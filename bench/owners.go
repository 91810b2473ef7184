package bench

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/onceflow/onceflow/processor"
)

// NoOwner summarizes how long partitions had no member running their
// worker: each wait runs from the moment a partition's worker stopped
// (revoked, lost, its member killed or stopped) to the moment a worker
// started for it again, on any member. Partitions not yet assigned at the
// start do not count.
type NoOwner struct {
	Waits    int     `json:"waits"`
	MedianMs float64 `json:"median_ms"`
	MaxMs    float64 `json:"max_ms"`
	TotalMs  float64 `json:"total_ms"` // summed over partitions
}

// ownerPoll is how often owners looks at the members' workers: the
// resolution of its waits.
const ownerPoll = 20 * time.Millisecond

// partitioned is a member whose partitions' workers can be listed
// (pipeline.Runner.Partitions).
type partitioned interface {
	Partitions() []processor.PartitionState
}

// owners watches which member runs each partition's worker, by polling
// every member the run started. It is safe for concurrent use.
type owners struct {
	mu   sync.Mutex
	ms   []*owned
	cur  map[int32]string    // the member running the partition's worker now; "" none
	free map[int32]time.Time // since when a partition once owned has had none
	gaps []float64           // ms
	hist map[int32][]ownerAt // who took each partition, when
}

// owned is one started member (an incarnation: a restart is another).
type owned struct {
	name string
	c    partitioned
	last []int32 // the partitions it ran at the latest poll that found any
}

type ownerAt struct {
	t    time.Time
	name string
}

func newOwners() *owners {
	return &owners{cur: map[int32]string{}, free: map[int32]time.Time{}, hist: map[int32][]ownerAt{}}
}

// add registers a member as it starts.
func (o *owners) add(name string, c partitioned) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ms = append(o.ms, &owned{name: name, c: c})
}

// watch polls until the returned stop is called, which waits for the
// polling goroutine and returns the waits.
func (o *owners) watch() (stop func() *NoOwner) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(ownerPoll)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				o.poll(now)
			}
		}
	}()
	return func() *NoOwner {
		close(quit)
		<-done
		o.mu.Lock()
		defer o.mu.Unlock()
		if len(o.gaps) == 0 {
			return &NoOwner{}
		}
		g := slices.Clone(o.gaps)
		slices.Sort(g)
		var total float64
		for _, x := range g {
			total += x
		}
		return &NoOwner{Waits: len(g), MedianMs: g[len(g)/2], MaxMs: g[len(g)-1], TotalMs: total}
	}
}

func (o *owners) poll(now time.Time) {
	o.mu.Lock()
	ms := slices.Clone(o.ms)
	o.mu.Unlock()
	runs := map[int32]string{}
	sets := make([][]int32, len(ms))
	for i, m := range ms {
		for _, p := range m.c.Partitions() {
			runs[p.Partition] = m.name
			sets[i] = append(sets[i], p.Partition)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, m := range ms {
		if len(sets[i]) > 0 {
			m.last = sets[i]
		}
	}
	for p, name := range runs {
		if o.cur[p] == name {
			continue
		}
		if since, ok := o.free[p]; ok {
			o.gaps = append(o.gaps, float64(now.Sub(since))/float64(time.Millisecond))
			delete(o.free, p)
		}
		o.cur[p] = name
		o.hist[p] = append(o.hist[p], ownerAt{now, name})
	}
	for p, name := range o.cur {
		if _, ok := runs[p]; !ok && name != "" {
			o.cur[p] = ""
			o.free[p] = now
		}
	}
}

// lastHeld returns the partitions that the incarnation of name before
// its latest one ran when last seen running any.
func (o *owners) lastHeld(name string) []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	seen := 0
	for i := len(o.ms) - 1; i >= 0; i-- {
		if o.ms[i].name != name {
			continue
		}
		if seen++; seen == 2 {
			return slices.Clone(o.ms[i].last)
		}
	}
	return nil
}

// retakeSettle is how long retaken gives a restarted member, once it runs
// a partition again, to run the rest of what it held, before it counts
// the ones it did not get back as moved.
const retakeSettle = time.Second

// retaken waits (up to timeout) until the latest incarnation of name runs
// every partition of held, or runs some and retakeSettle has passed (a
// rebalance for another change, such as an earlier static leave's
// session ending, may have given the rest to others), and returns how
// many of held another member ran since from or runs now; ok is false
// when the restarted member ran no partition in time.
func (o *owners) retaken(ctx context.Context, name string, held []int32, from time.Time, timeout time.Duration) (moved int, ok bool) {
	deadline := time.Now().Add(timeout)
	var back time.Time // when the restarted member first ran a partition
	for {
		o.mu.Lock()
		all := true
		for _, p := range held {
			all = all && o.cur[p] == name
		}
		// The latest incarnation has been seen running a partition: o.cur
		// is of a poll after the restart, not of the killed incarnation.
		var latest *owned
		for _, m := range o.ms {
			if m.name == name {
				latest = m
			}
		}
		if latest != nil && len(latest.last) > 0 && back.IsZero() {
			back = time.Now()
		}
		if !back.IsZero() && (all || time.Since(back) >= retakeSettle) {
			for _, p := range held {
				if o.cur[p] != name {
					moved++
					continue
				}
				for _, h := range o.hist[p] {
					if !h.t.Before(from) && h.name != name {
						moved++
						break
					}
				}
			}
			o.mu.Unlock()
			return moved, true
		}
		o.mu.Unlock()
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, false
		}
		time.Sleep(ownerPoll)
	}
}
