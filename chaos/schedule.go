package main

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// faultKind names one kind of fault; the names are those of -faults.
type faultKind string

const (
	faultKill          faultKind = "kill"           // SIGKILL a member, restart it
	faultTerm          faultKind = "term"           // SIGTERM a member, start a replacement at once
	faultStop          faultKind = "stop"           // SIGSTOP past the session timeout, then SIGCONT: a zombie
	faultPGRestart     faultKind = "pg-restart"     // Postgres restart -m immediate
	faultBrokerRestart faultKind = "broker-restart" // kill -9 the broker, start it again
	faultConnCut       faultKind = "conn-cut"       // cut Postgres connections mid-transaction
	faultCommitCut     faultKind = "commit-cut"     // cut Postgres connections during COMMIT
	faultStorm         faultKind = "storm"          // members join and leave in quick succession
	faultReplay        faultKind = "replay"         // stop the group, onceflow replay --to-time, start it again
	faultLatency       faultKind = "pg-latency"     // latency on the Postgres link while a burst of bad records is isolated
	faultRecreate      faultKind = "recreate"       // the topic deleted and created again under the running members
)

// allFaults lists every kind, in the order summaries name them.
var allFaults = []faultKind{faultKill, faultTerm, faultStop, faultPGRestart, faultBrokerRestart,
	faultConnCut, faultCommitCut, faultStorm, faultReplay, faultLatency, faultRecreate}

// edgeFaults are the kinds that happen once a run, at a fixed share of
// the window (edgeAt), with their own checks in the verdict: never drawn
// by weight, and drawn from their own stream, so that adding them left
// every other fault of a seed where it was.
var edgeFaults = []faultKind{faultLatency, faultRecreate}

// edgeAt is when an edge fault starts, as a share of the window: the
// recreate early, so that the producer has most of its records still to
// send into the new topic; the latency after it, on the new topic. The
// other faults wait for each (see runFaults).
var edgeAt = map[faultKind]float64{faultRecreate: 0.2, faultLatency: 0.45}

// The pg-latency fault: latencyEachWay on both directions of the Postgres
// link while a burst of latencyBurst consecutive records, each a handler
// data error, is isolated; every one must be a dead letter within
// latencyBound of the burst's publication. Isolating a bad record costs
// about 15 round trips (two savepoint groups, each a savepoint, the
// claim's and the email's COPY, the failing statement, the rollback): at
// 10 ms each way, a batch holding the burst (70 records of 3 KB: one
// fetch's worth) takes over 20 s in one transaction, twice the members'
// tx_timeout; an isolation that keeps its progress needs about as long in
// all, under a third of the bound.
const (
	latencyEachWay = 10 * time.Millisecond
	latencyBurst   = 70
	latencyBound   = 90 * time.Second
	latencyCatchUp = 30 * time.Second // bound on the wait for the burst's partition to catch up first
)

// The recreate fault: the new topic's records must be consumed by the
// members running at the recreate (none starts meanwhile) within
// recreateBound; the old topic must reach its end, with the producer
// paused, within recreateDrain.
const (
	recreateBound = 30 * time.Second
	recreateDrain = 60 * time.Second
)

// weight is how often a kind is drawn, relative to the others.
var weight = map[faultKind]int{
	faultKill: 30, faultTerm: 10, faultStop: 8, faultPGRestart: 7, faultBrokerRestart: 4,
	faultConnCut: 14, faultCommitCut: 18, faultStorm: 6, faultReplay: 3,
}

// Variants of the connection cuts.
const (
	cutMidTx     = "midtx"     // a statement inside a transaction never reaches Postgres
	cutAll       = "all"       // every connection through the proxy at once, wherever it is
	cutTerminate = "terminate" // pg_terminate_backend on a backend idle in transaction or running COMMIT
	cutBefore    = "before"    // COMMIT never reaches Postgres: the transaction rolls back
	cutAfter     = "after"     // Postgres committed, the reply is lost: the outcome is unknown to the member
)

// Variants of the replay.
const (
	replayToTime  = "time"  // onceflow replay --to-time Pause
	replayToStart = "start" // onceflow replay --to-start: every record again
)

// fault is one scheduled fault. Everything about it is drawn from the
// seed; only where exactly a cut lands depends on timing.
type fault struct {
	At      time.Duration // since the faults began
	Kind    faultKind
	Target  int           // which running member: an index modulo their number, in start order
	Pause   time.Duration // kill: until the restart; stop: how long stopped; pg-restart, broker-restart: down time; storm: how long the joiners stay; replay: how long the group is stopped; pg-latency: bound on the burst's isolation; recreate: bound on the new topic's consumption
	N       int           // conn-cut, commit-cut: connections to cut at most; storm: members that join; replay (time): seconds back; pg-latency: records in the burst; recreate: partitions added to the new topic (0: as many as before)
	Variant string        // conn-cut: midtx, all or terminate; commit-cut: before or after; replay: time or start
	Skip    int           // midtx: client writes of the transaction let through before the cut
	Latency time.Duration // pg-latency: added to each direction of the Postgres link
}

func (f fault) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-14s", f.Kind)
	switch f.Kind {
	case faultKill:
		fmt.Fprintf(&b, " member#%d, restart after %v", f.Target, f.Pause)
	case faultTerm:
		fmt.Fprintf(&b, " member#%d, replacement at once", f.Target)
	case faultStop:
		fmt.Fprintf(&b, " member#%d for %v", f.Target, f.Pause)
	case faultPGRestart:
		if f.Pause == 0 {
			b.WriteString(" restart -m immediate")
		} else {
			fmt.Fprintf(&b, " stop -m immediate, down for %v", f.Pause)
		}
	case faultBrokerRestart:
		fmt.Fprintf(&b, " down for %v", f.Pause)
	case faultConnCut:
		fmt.Fprintf(&b, " %s, up to %d connections", f.Variant, f.N)
		if f.Variant == cutMidTx {
			fmt.Fprintf(&b, " after %d writes of a transaction", f.Skip)
		}
	case faultCommitCut:
		fmt.Fprintf(&b, " %s the server commits, up to %d connections", f.Variant, f.N)
	case faultStorm:
		fmt.Fprintf(&b, " %d join, stay %v, leave (one killed)", f.N, f.Pause)
	case faultReplay:
		if f.Variant == replayToStart {
			b.WriteString(" stop the group, rewind it to the log start")
		} else {
			fmt.Fprintf(&b, " stop the group, rewind it %ds", f.N)
		}
		fmt.Fprintf(&b, ", start it again %v after the stop", f.Pause)
	case faultLatency:
		fmt.Fprintf(&b, " %v each way on the postgres link; %d records refused by a handler (a data error) in a row on partition#%d, dead letters within %v", f.Latency, f.N, f.Target, f.Pause)
	case faultRecreate:
		fmt.Fprintf(&b, " pause the producer until every record is consumed, delete the topic, create it with %+d partitions, poison at offsets of old dead letters; consumed within %v", f.N, f.Pause)
	}
	return b.String()
}

// scheduleConfig is what a schedule is drawn from, besides the seed.
type scheduleConfig struct {
	Kinds          []faultKind   // enabled kinds; each occurs at least once when there is room
	Window         time.Duration // faults start within it
	Gap            time.Duration // mean time between two fault starts
	MinKills       int           // at least this many kill faults, room permitting
	SessionTimeout time.Duration // a stop lasts longer than this
}

// newSchedule draws the fault schedule of seed. The same seed and config
// give the same schedule.
func newSchedule(seed uint64, c scheduleConfig) []fault {
	out := newRegular(seed, c)
	rng := rand.New(rand.NewPCG(seed, 0x65646765)) // "edge": the edge faults' own stream
	for _, k := range edgeFaults {
		if !slices.Contains(c.Kinds, k) {
			continue
		}
		f := fault{At: time.Duration(float64(c.Window) * edgeAt[k]).Round(time.Millisecond), Kind: k, Target: rng.IntN(1 << 10)}
		switch k {
		case faultLatency:
			f.Latency, f.N, f.Pause = latencyEachWay, latencyBurst, latencyBound
		case faultRecreate:
			f.N, f.Pause = 2*rng.IntN(2), recreateBound
		}
		out = append(out, f)
	}
	slices.SortStableFunc(out, func(a, b fault) int { return cmp.Compare(a.At, b.At) })
	return out
}

// newRegular draws the faults of every kind but the edge faults.
func newRegular(seed uint64, c scheduleConfig) []fault {
	c.Kinds = slices.DeleteFunc(slices.Clone(c.Kinds), func(k faultKind) bool { return slices.Contains(edgeFaults, k) })
	if len(c.Kinds) == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos": independent of the workload's stream
	var times []time.Duration
	for at := c.Gap / 2; at < c.Window; at += c.Gap/2 + time.Duration(rng.Int64N(int64(c.Gap))) {
		times = append(times, at.Round(time.Millisecond))
	}
	n := len(times)
	kinds := make([]faultKind, n)
	// One of each enabled kind at random places, so that a short run has
	// them all; the rest drawn by weight.
	mandatory := map[int]bool{}
	for i, pos := range rng.Perm(n) {
		if i >= len(c.Kinds) {
			break
		}
		kinds[pos] = c.Kinds[i]
		mandatory[pos] = true
	}
	total := 0
	for _, k := range c.Kinds {
		total += weight[k]
	}
	for i := range kinds {
		if kinds[i] != "" {
			continue
		}
		x := rng.IntN(total)
		for _, k := range c.Kinds {
			if x -= weight[k]; x < 0 {
				kinds[i] = k
				break
			}
		}
	}
	if slices.Contains(c.Kinds, faultKill) {
		kills := 0
		for _, k := range kinds {
			if k == faultKill {
				kills++
			}
		}
		for _, pos := range rng.Perm(n) {
			if kills >= c.MinKills {
				break
			}
			if kinds[pos] != faultKill && !mandatory[pos] {
				kinds[pos] = faultKill
				kills++
			}
		}
	}
	out := make([]fault, n)
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	for i, k := range kinds {
		f := fault{At: times[i], Kind: k, Target: rng.IntN(1 << 10)}
		switch k {
		case faultKill:
			f.Pause = ms(0, 1500)
		case faultStop:
			f.Pause = c.SessionTimeout + ms(1000, 4000)
		case faultPGRestart:
			if rng.IntN(2) == 1 {
				f.Pause = ms(1000, 6000) // down that long; 0: restart at once
			}
		case faultBrokerRestart:
			f.Pause = ms(0, 3000)
		case faultConnCut:
			f.Variant = []string{cutMidTx, cutMidTx, cutAll, cutTerminate}[rng.IntN(4)]
			f.N = 1 + rng.IntN(4)
			f.Skip = rng.IntN(4)
		case faultCommitCut:
			f.Variant = []string{cutBefore, cutAfter, cutAfter}[rng.IntN(3)]
			f.N = 1 + rng.IntN(3)
		case faultStorm:
			f.N = 2 + rng.IntN(3)
			f.Pause = ms(500, 3000)
		case faultReplay:
			// Far enough back for several batches a partition (the
			// start: the backlog and all since), so that the re-read
			// defers offsets and meets new records behind them.
			// Stopped for a while, so that records pile up behind the
			// re-read, as traffic does behind an operator's replay.
			f.Variant = []string{replayToStart, replayToStart, replayToTime}[rng.IntN(3)]
			f.N = 10 + rng.IntN(51)
			f.Pause = ms(1000, 8000)
		}
		out[i] = f
	}
	return out
}

// parseFaults reads -faults: "all" or comma-separated kinds.
func parseFaults(s string) ([]faultKind, error) {
	if s == "all" {
		return slices.Clone(allFaults), nil
	}
	var out []faultKind
	if strings.TrimSpace(s) == "" || s == "none" {
		return out, nil
	}
	for _, name := range strings.Split(s, ",") {
		k := faultKind(strings.TrimSpace(name))
		if !slices.Contains(allFaults, k) {
			return nil, fmt.Errorf("unknown fault %q (known: %s, all, none)", name, joinKinds(allFaults))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func joinKinds(ks []faultKind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}
