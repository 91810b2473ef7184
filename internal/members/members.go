package members

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/onceflow/onceflow/processor"
)

// Member is one running member of a consumer group.
type Member interface {
	// Name is the member's client id.
	Name() string
	// Leave stops the member cleanly — its in-flight batches finish, its
	// offsets are committed, it leaves the group — and returns once it has
	// stopped, with the error it stopped on, if any.
	Leave() error
	// Crash stops the member as a crash would: nothing more is committed,
	// to Kafka or Postgres. It returns once the member has stopped.
	Crash() error
	// Stats returns the member's counters; it may be called at any time,
	// also after the member stopped.
	Stats() processor.Stats
}

// Starter starts a member called name. The member runs until it is told to
// leave or crash: ctx carries values, its cancellation does not stop the
// member (the Group does).
type Starter func(ctx context.Context, name string) (Member, error)

// Counts are a Group's membership changes.
type Counts struct {
	Started int // members started
	Running int // started and not stopped
	Left    int // stopped cleanly by Leave or Churn (StopAll, the end, is not counted)
	Crashed int // stopped as a crash
}

// Group is the members one owner runs, in start order. It is safe for
// concurrent use. Its owner calls StopAll on every path.
type Group struct {
	start Starter

	mu      sync.Mutex
	all     []Member // every member started, for Stats
	running []Member // oldest first
	counts  Counts
}

// NewGroup returns an empty Group whose members start is starts.
func NewGroup(start Starter) *Group { return &Group{start: start} }

// Start starts a member named "member-N" (N counting from 1).
func (g *Group) Start(ctx context.Context) (Member, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	name := fmt.Sprintf("member-%d", g.counts.Started+1)
	m, err := g.start(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	g.all = append(g.all, m)
	g.running = append(g.running, m)
	g.counts.Started++
	g.counts.Running++
	return m, nil
}

// oldest takes the longest-running member out of the running ones, or nil.
func (g *Group) oldest(crash bool) Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.running) == 0 {
		return nil
	}
	m := g.running[0]
	g.running = g.running[1:]
	g.counts.Running--
	if crash {
		g.counts.Crashed++
	} else {
		g.counts.Left++
	}
	return m
}

// Leave stops the longest-running member cleanly and returns once it has
// stopped; false when none runs.
func (g *Group) Leave() (bool, error) {
	m := g.oldest(false)
	if m == nil {
		return false, nil
	}
	return true, m.Leave()
}

// Crash stops the longest-running member as a crash would (no commit) and
// returns once it has stopped; false when none runs.
func (g *Group) Crash() (bool, error) {
	m := g.oldest(true)
	if m == nil {
		return false, nil
	}
	return true, m.Crash()
}

// Restart stops the longest-running member as a crash would and starts
// it again under its name, which InProcessConfig.Consumer.InstanceID
// makes the same static member to the group; it returns the new member,
// or nil when none runs. The crash counts in Counts.Crashed, the start in
// Counts.Started.
func (g *Group) Restart(ctx context.Context) (Member, error) {
	m := g.oldest(true)
	if m == nil {
		return nil, nil
	}
	if err := m.Crash(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n, err := g.start(ctx, m.Name())
	if err != nil {
		return nil, fmt.Errorf("restart %s: %w", m.Name(), err)
	}
	g.all = append(g.all, n)
	g.running = append(g.running, n)
	g.counts.Started++
	g.counts.Running++
	return n, nil
}

// Churn is the n-th (from 1) change of a group that keeps its size: a new
// member joins, then the longest-running one stops — as a crash on every
// third change, cleanly otherwise. crashed says which.
func (g *Group) Churn(ctx context.Context, n int) (crashed bool, err error) {
	if _, err := g.Start(ctx); err != nil {
		return false, err
	}
	crashed = CrashTurn(n)
	if crashed {
		_, err = g.Crash()
	} else {
		_, err = g.Leave()
	}
	return crashed, err
}

// CrashTurn reports whether the n-th (from 1) membership change of a run
// is a crash: every third one is, the others are clean.
func CrashTurn(n int) bool { return n%3 == 0 }

// StopAll makes every running member leave, all at once, and returns once
// all have stopped, with their errors. It is safe to call more than once.
func (g *Group) StopAll() error {
	g.mu.Lock()
	rs := g.running
	g.running = nil
	g.counts.Running = 0
	g.mu.Unlock()
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, m := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Leave()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Stats returns the counters summed over every member the group started,
// stopped ones included.
func (g *Group) Stats() processor.Stats {
	g.mu.Lock()
	all := append([]Member(nil), g.all...)
	g.mu.Unlock()
	var s processor.Stats
	for _, m := range all {
		s = s.Plus(m.Stats())
	}
	return s
}

// Counts returns the group's membership changes so far.
func (g *Group) Counts() Counts {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.counts
}
