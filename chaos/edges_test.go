package main

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/onceflow/onceflow/internal/orders"
)

func TestScheduleEdgeFaults(t *testing.T) {
	cfg := scheduleConfig{Kinds: allFaults, Window: 75 * time.Second, Gap: 3 * time.Second, SessionTimeout: 3 * time.Second}
	regular := cfg
	regular.Kinds = slices.DeleteFunc(slices.Clone(allFaults), func(k faultKind) bool { return slices.Contains(edgeFaults, k) })
	for seed := uint64(1); seed <= 20; seed++ {
		all, without := newSchedule(seed, cfg), newSchedule(seed, regular)
		var rest []fault
		n := map[faultKind]int{}
		for _, f := range all {
			if !slices.Contains(edgeFaults, f.Kind) {
				rest = append(rest, f)
				continue
			}
			n[f.Kind]++
			if want := time.Duration(float64(cfg.Window) * edgeAt[f.Kind]).Round(time.Millisecond); f.At != want {
				t.Errorf("seed %d: %v at %v, want %v", seed, f.Kind, f.At, want)
			}
		}
		if n[faultLatency] != 1 || n[faultRecreate] != 1 {
			t.Errorf("seed %d: edge faults %v, want one of each", seed, n)
		}
		if !slices.Equal(rest, without) {
			t.Errorf("seed %d: the edge faults moved the others:\n%v\n%v", seed, rest, without)
		}
	}
}

// The new topic's poison at an offset where the old topic had a dead
// letter: the old row alone (an insert that conflicted with it) leaves the
// new record without its dead letter, passed over: a failure.
func TestJudgeRecreatedTopic(t *testing.T) {
	evC := uuid.MustParse("00000000-0000-4000-8000-00000000000c")
	newPoison := &record{Seq: 9, Kind: "bad-json", ID: uuid.MustParse("00000000-0000-4000-8000-0000000000f9")}
	expectation := func() *expectation {
		e := smallExpectation() // the old topic: records at 0@0-2, 1@0, poison at 0@1
		e.Inc = 1
		at := func(p int32, o int64) pos { return pos{Partition: p, Offset: o, Inc: 1} }
		e.Orders[evC] = orders.Order{UserID: 3, Items: []string{"X"}}
		e.Copies[evC] = []pos{at(0, 0)}
		e.Copies[evA] = append(e.Copies[evA], at(2, 0)) // a redelivery into the new topic
		e.At[at(0, 0)] = &record{Seq: 7, Kind: kindOrder, ID: evC}
		e.At[at(0, 1)] = newPoison
		e.At[at(2, 0)] = &record{Seq: 8, Kind: kindRedelivery, ID: evA}
		e.Poison[at(0, 1)] = newPoison
		e.Ends = map[int32]int64{0: 2, 1: 0, 2: 1}
		return e
	}
	observation := func() *observed {
		o := perfectObservation()
		o.Processed[evC] = maps.Clone(o.Processed[evA])
		o.Emails[evC] = 1
		o.Counters = map[string]int64{"orders": 3, "items": 4}
		o.Inventory["X"] = 2
		o.Weights[userItem{3, "X"}] = 1
		o.DeadLetters[pos{Partition: 0, Offset: 1, Inc: 1}] = deadLetter{Count: 1}
		o.Stored = map[int32]int64{0: 2, 2: 1} // of the new topic only
		return o
	}
	if v := judge(expectation(), observation(), orders.Names); !v.pass() || v.DLOK != 2 {
		t.Fatalf("both incarnations whole: not a pass: %+v", v)
	}
	o := observation()
	delete(o.DeadLetters, pos{Partition: 0, Offset: 1, Inc: 1})
	v := judge(expectation(), o, orders.Names)
	if v.pass() || !slices.Equal(v.DLMissing, []pos{{Partition: 0, Offset: 1, Inc: 1}}) {
		t.Fatalf("the new topic's poison at the old dead letter's offset without its own: DLMissing %v, pass %v; want [0@1(new topic)], a failure", v.DLMissing, v.pass())
	}
	o = observation()
	o.Stored = map[int32]int64{} // the new topic never consumed: old rows do not count
	v = judge(expectation(), o, orders.Names)
	if v.pass() || len(v.Stuck) != 2 {
		t.Fatalf("the new topic not consumed: stuck %v; want partitions 0 and 2", v.Stuck)
	}
}

// The new topic's first records put poison exactly at the old dead
// letters' offsets (the first two of each partition within reuseWithin)
// and good records everywhere before and between.
func TestReusePrefix(t *testing.T) {
	w, err := newWorkload(5, workloadConfig{Events: 50, Partitions: 3, MaxRecordBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := &chaos{o: options{seed: 5, maxRecord: 1 << 20}, led: newLedger(w)}
	var old []landed
	for i, r := range w.Records {
		old = append(old, landed{Partition: r.Partition, Offset: int64(i), Seq: r.Seq})
	}
	oldDL := []pos{{Partition: 1, Offset: 9}, {Partition: 1, Offset: 3}, {Partition: 1, Offset: 12}, {Partition: 2, Offset: reuseWithin + 1}, {Partition: 0, Offset: 0}}
	want := map[int32][]int64{0: {0}, 1: {3, 9}} // 1@12 is a third; 2@601 too far
	got := map[int32][]int64{}
	n := map[int32]int64{}
	for _, r := range c.reusePrefix(oldDL, old) {
		if r.poison() {
			got[r.Partition] = append(got[r.Partition], n[r.Partition])
		} else if _, ok := w.Orders[r.ID]; !ok || r.Kind != kindRedelivery {
			t.Fatalf("record %d of partition %d: %s, not a redelivery of a good event", n[r.Partition], r.Partition, r.Kind)
		}
		n[r.Partition]++
	}
	if !maps.EqualFunc(got, want, slices.Equal) || n[0] != 1 || n[1] != 10 || n[2] != 0 {
		t.Fatalf("poison at %v in %v records a partition; want poison at %v in map[0:1 1:10]", got, n, want)
	}
}

// The recreate fault's checks fail the run, each with its own line: the
// new topic not consumed within the bound, the grow not carried out, or
// the grown topic not consumed within it; a recreate and grow consumed in
// time fail nothing.
func TestRecreateEdgeFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  recreateOutcome
		want string
	}{
		{"consumed", recreateOutcome{Consumed: time.Second, GrownParts: 8, Grown: time.Second}, ""},
		{"new topic not consumed", recreateOutcome{Consumed: -1, Behind: "0 at -1/5"}, "recreate: the members"},
		{"grow failed", recreateOutcome{Consumed: time.Second, GrownParts: 8, Grown: -1, GrowFailed: "add partitions: refused"}, "grow: add partitions: refused"},
		{"grown topic not consumed", recreateOutcome{Consumed: time.Second, GrownParts: 8, Grown: -1, GrowBehind: "6 at -1/47"}, "grow: the members did not store the end offsets of the topic grown to 8 partitions"},
	} {
		c := &chaos{rec: &tc.rec}
		got := strings.Join(c.edgeFailures(), "\n")
		if tc.want == "" && got != "" || tc.want != "" && !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: edge failures %q, want %q", tc.name, got, tc.want)
		}
	}
}
