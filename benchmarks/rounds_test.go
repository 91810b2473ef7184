package main

import (
	"strings"
	"testing"
)

func TestMedianRun(t *testing.T) {
	runs := func(rates ...float64) []*Run {
		rs := make([]*Run, len(rates))
		for i, x := range rates {
			rs[i] = &Run{Name: "steady", UniqueEventsPerSec: x, ExactlyOnce: true, Seconds: float64(i)}
		}
		return rs
	}
	one := runs(5)
	if m := medianRun(one); m != one[0] || m.Rounds != nil {
		t.Fatalf("one round: got %+v, want the run itself without Rounds", m)
	}
	three := runs(30, 10, 20)
	m := medianRun(three)
	if m != three[2] {
		t.Fatalf("median of 30, 10, 20: got the run at %v/s", m.UniqueEventsPerSec)
	}
	if want := []float64{30, 10, 20}; len(m.Rounds) != 3 || m.Rounds[0] != want[0] || m.Rounds[1] != want[1] || m.Rounds[2] != want[2] {
		t.Fatalf("Rounds %v, want every round in the order run %v", m.Rounds, want)
	}
	if m := medianRun(runs(40, 10, 30, 20)); m.UniqueEventsPerSec != 20 {
		t.Fatalf("median of four: got %v, want the lower middle 20", m.UniqueEventsPerSec)
	}
	bad := runs(10, 20, 30)
	bad[2].ExactlyOnce = false
	if m := medianRun(bad); m != bad[2] {
		t.Fatalf("a round that was not exactly once must be the one reported, got the run at %v/s", m.UniqueEventsPerSec)
	}
}

func TestMarkdownListsRounds(t *testing.T) {
	rep := &Report{Runs: []*Run{
		{Name: "steady", Kind: "scenario", UniqueEventsPerSec: 20, Rounds: []float64{30, 10, 20}, ExactlyOnce: true},
		{Name: "raw-copy", Kind: "baseline", UniqueEventsPerSec: 40, ExactlyOnce: true},
	}}
	md := markdown(rep)
	if !strings.Contains(md, "| steady | 30, 10, 20 | 3.00 |") {
		t.Fatalf("rounds of steady missing:\n%s", md)
	}
	if strings.Contains(md, "| raw-copy | 40") {
		t.Fatalf("a run of one round listed among the rounds:\n%s", md)
	}
}

func TestMarkdownGivesTheRateUntilTheFirstPartitionIsDone(t *testing.T) {
	rep := &Report{Runs: []*Run{
		{Name: "steady", Kind: "scenario", Seconds: 10, FirstDoneSeconds: 9.5, FirstDoneEventsPerSec: 100000, ExactlyOnce: true},
		{Name: "replay", Kind: "scenario", Seconds: 12, ExactlyOnce: true},
	}}
	md := markdown(rep)
	if !strings.Contains(md, "steady 100000 events/s until 9.5 s, then 0.5 s for the rest.") {
		t.Fatalf("rate until the first partition was done missing:\n%s", md)
	}
	if strings.Contains(md, "replay 0 events/s") {
		t.Fatalf("a run without it listed:\n%s", md)
	}
}
