package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/processor"
)

// runName is the name of scenario's run under protocol: the scenario's
// alone when the benchmark runs one protocol, suffixed with it when
// -group-protocol lists several.
func runName(scenario, protocol string, protocols []string) string {
	if len(protocols) < 2 {
		return scenario
	}
	return scenario + "-" + protocol
}

// stormMargin is how many times the storm's expected length its backlog
// holds at the steady rate: a storm runs slower than steady, so a backlog
// that lasts stormMargin times the changes' span outlasts them.
const stormMargin = 2

// stormMaxEvents bounds a storm's backlog (the harness holds the stream
// in memory for the check).
const stormMaxEvents = 5_000_000

// stormEvents is the storm's backlog, in unique events: at least -events,
// and enough to last stormMargin times its -storm-changes changes, one
// every -storm-every, at this protocol's steady rate (when steady ran
// before it). A storm is defined by its changes, not its events: on the
// real broker 500 000 events drained in 5 s, which saw two changes.
func (b *bench) stormEvents() int {
	rate := b.steadyRate[b.protocol]
	if rate <= 0 {
		progress("storm: no steady rate measured before it (-scenarios steady,storm,...): its backlog is -events, %d", b.o.events)
		return b.o.events
	}
	span := float64(b.o.stormChanges) * b.o.stormEvery.Seconds()
	n := int(math.Ceil(rate * span * stormMargin))
	if n > stormMaxEvents {
		progress("storm: %d events would outlast %d changes at %.0f events/s; capped at %d", n, b.o.stormChanges, rate, stormMaxEvents)
		n = stormMaxEvents
	}
	return max(b.o.events, n)
}

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

// owners watches which member runs each partition's worker, by polling
// every member the run started (processor.Consumer.Partitions). It is
// safe for concurrent use.
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
	c    *processor.Consumer
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
func (o *owners) add(name string, c *processor.Consumer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ms = append(o.ms, &owned{name: name, c: c})
}

// watch polls until the returned stop is called, which returns the waits.
func (o *owners) watch(start time.Time) (stop func() *NoOwner) {
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

// retaken waits (up to timeout) until the latest incarnation of name runs
// every partition of held, and returns how many of them another member
// ran since from; ok is false when the restart did not take them all back
// in time.
func (o *owners) retaken(ctx context.Context, name string, held []int32, from time.Time, timeout time.Duration) (moved int, ok bool) {
	deadline := time.Now().Add(timeout)
	for {
		o.mu.Lock()
		all := true
		for _, p := range held {
			all = all && o.cur[p] == name
		}
		if all {
			for _, p := range held {
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

// ProtocolSummary compares one group protocol's scenarios (the median
// runs of their rounds).
type ProtocolSummary struct {
	Protocol string  `json:"protocol"`
	Steady   float64 `json:"steady_events_per_sec"`
	Storm    float64 `json:"storm_events_per_sec,omitempty"`
	Replay   float64 `json:"replay_events_per_sec,omitempty"`
	// StormVsSteady and ReplayVsSteady are the medians' ratios.
	StormVsSteady  float64 `json:"storm_vs_steady,omitempty"`
	ReplayVsSteady float64 `json:"replay_vs_steady,omitempty"`
	// StormChanges counts the median storm's changes by kind.
	StormChanges map[string]int `json:"storm_changes,omitempty"`
	StormShort   bool           `json:"storm_short,omitempty"`
	// StormRecoveryMs is the median over rounds of each storm's median
	// recovery after a change; StormNoOwner the median storm's waits.
	StormRecoveryMs float64  `json:"storm_recovery_median_ms,omitempty"`
	StormNoOwner    *NoOwner `json:"storm_no_owner,omitempty"`
	// ReplayRestartMs is the median over rounds of the time from the
	// replay's restart to 90 % of the rate before its stop.
	ReplayRestartMs float64 `json:"replay_restart_recovery_median_ms,omitempty"`
	// ReplayRestartRounds is how many rounds' replays recovered before
	// their stream ended (the median is of those).
	ReplayRestartRounds int      `json:"replay_restart_rounds,omitempty"`
	ReplayNoOwner       *NoOwner `json:"replay_no_owner,omitempty"`
	// StaticMoved (with -instance-id): partitions of restarted static
	// members that another member ran meanwhile, in the median storm,
	// out of StaticHeld.
	StaticMoved *int `json:"static_moved,omitempty"`
	StaticHeld  int  `json:"static_held,omitempty"`
}

// summarize compares the protocols from every round's runs.
func summarize(o options, rounds map[string][]*Run) []ProtocolSummary {
	var out []ProtocolSummary
	for _, p := range o.protocols {
		s := ProtocolSummary{Protocol: p}
		get := func(sc string) *Run {
			rs := rounds[runName(sc, p, o.protocols)]
			if len(rs) == 0 {
				return nil
			}
			return medianRun(rs)
		}
		steady, storm, replay := get("steady"), get("storm"), get("replay")
		if steady != nil {
			s.Steady = steady.UniqueEventsPerSec
		}
		if storm != nil {
			s.Storm, s.StormShort, s.StormNoOwner = storm.UniqueEventsPerSec, storm.StormShort, storm.NoOwner
			s.StormRecoveryMs = median(storm.RoundsRecoveryMs, storm.RecoveryMedianMs)
			s.StormChanges = map[string]int{}
			for _, m := range storm.Marks {
				s.StormChanges[m.Kind]++
				s.StaticHeld += m.Held
			}
			s.StaticMoved = storm.StaticMoved
			if s.Steady > 0 {
				s.StormVsSteady = s.Storm / s.Steady
			}
		}
		if replay != nil {
			s.Replay, s.ReplayNoOwner = replay.UniqueEventsPerSec, replay.NoOwner
			s.ReplayRestartMs, s.ReplayRestartRounds = measured(replay.RoundsRestartRecoveryMs, replay.RestartRecoveryMs)
			if s.Steady > 0 {
				s.ReplayVsSteady = s.Replay / s.Steady
			}
		}
		out = append(out, s)
	}
	return out
}

// median is xs' median (the lower middle), or one when xs is empty (a
// single round).
func median(xs []float64, one float64) float64 {
	if len(xs) == 0 {
		return one
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// measured is the median (the lower middle) of the positive xs, and how
// many there are; of one alone when xs is empty (a single round).
func measured(xs []float64, one float64) (float64, int) {
	if len(xs) == 0 {
		xs = []float64{one}
	}
	var pos []float64
	for _, x := range xs {
		if x > 0 {
			pos = append(pos, x)
		}
	}
	if len(pos) == 0 {
		return 0, 0
	}
	return median(pos, 0), len(pos)
}

// writeProtocols writes the protocols' comparison.
func writeProtocols(b *strings.Builder, rep *Report) {
	if len(rep.Protocols) == 0 {
		return
	}
	b.WriteString("\n### Group protocols side by side\n\n" +
		"| protocol | steady events/s | storm events/s (× steady) | storm changes | storm recovery median ms | storm: partition waits with no owner (n, median / max ms) | " +
		"replay events/s (× steady) | replay: records/s back at 90 % after its restart, ms (rounds) | static restarts: partitions moved / held |\n" +
		"|---|---:|---:|---|---:|---:|---:|---:|---:|\n")
	noOwner := func(n *NoOwner) string {
		if n == nil {
			return "–"
		}
		return fmt.Sprintf("%d, %.0f / %.0f", n.Waits, n.MedianMs, n.MaxMs)
	}
	for _, s := range rep.Protocols {
		var kinds []string
		for _, k := range []string{"join", "leave", "crash", "restart"} {
			if n := s.StormChanges[k]; n > 0 {
				kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
			}
		}
		changes := strings.Join(kinds, ", ")
		if s.StormShort {
			changes += " (**the stream ran out first**)"
		}
		static := "–"
		if s.StaticMoved != nil {
			static = fmt.Sprintf("%d / %d", *s.StaticMoved, s.StaticHeld)
		}
		storm := "– | – | – | –" // not run
		if s.Storm > 0 {
			storm = fmt.Sprintf("%.0f (%.2f×) | %s | %.0f | %s", s.Storm, s.StormVsSteady, or(changes, "–"), s.StormRecoveryMs, noOwner(s.StormNoOwner))
		}
		replay := "– | –"
		if s.Replay > 0 {
			replay = fmt.Sprintf("%.0f (%.2f×) | %.0f (%d)", s.Replay, s.ReplayVsSteady, s.ReplayRestartMs, s.ReplayRestartRounds)
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %s |\n", s.Protocol, s.Steady, storm, replay, static)
	}
	b.WriteString("\nRates and ratios are of each scenario's median round; recovery times are medians over the rounds. " +
		"A storm makes its -storm-changes changes one every -storm-every (a change due while another runs starts when it returns), " +
		"on a backlog sized from the steady rate to outlast them twice. " +
		"The replay's recovery runs from the group's start after the rewind until the records it consumes per second (its re-read included) are back at 90 % " +
		"of their rate before the stop, median of the rounds in which they were before the stream ended (how many in parentheses). " +
		"A wait with no owner runs from a partition's worker stopping on one member " +
		"to one starting on any member (polled every 20 ms); the replay's include the whole group's stop and rewind.\n")
}
