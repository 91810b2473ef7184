package main

import (
	"strings"
	"testing"
	"time"
)

// A storm's backlog outlasts its changes at the steady rate, twice; it is
// never below -events, and -events alone when no steady rate is known.
func TestStormEvents(t *testing.T) {
	o := options{events: 1000, stormChanges: 12, stormEvery: time.Second, protocols: []string{"classic", "consumer"}}
	for _, tc := range []struct {
		name string
		rate float64
		want int
	}{
		{"no steady run", 0, 1000},
		{"fast", 50000, 50000 * 12 * stormMargin},
		{"slow: -events is more", 10, 1000},
		{"capped", 1e9, stormMaxEvents},
	} {
		b := &bench{o: o, protocol: "consumer", steadyRate: map[string]float64{"consumer": tc.rate, "classic": 1}}
		if got := b.stormEvents(); got != tc.want {
			t.Errorf("%s: %d events, want %d", tc.name, got, tc.want)
		}
	}
}

// With several protocols each run's name says which; the summary compares
// each protocol's median rounds and counts the storm's changes by kind.
func TestSummarizeProtocols(t *testing.T) {
	o := options{protocols: []string{"classic", "consumer"}}
	if got := runName("storm", "consumer", o.protocols); got != "storm-consumer" {
		t.Errorf("runName: %q", got)
	}
	if got := runName("storm", "consumer", []string{"consumer"}); got != "storm" {
		t.Errorf("runName of one protocol: %q", got)
	}
	moved := 1
	rounds := map[string][]*Run{
		"steady-consumer": {{UniqueEventsPerSec: 100, ExactlyOnce: true}},
		"storm-consumer": {{UniqueEventsPerSec: 90, ExactlyOnce: true, RecoveryMedianMs: 500, StaticMoved: &moved,
			Marks: []Mark{{Kind: "join"}, {Kind: "leave"}, {Kind: "restart", Held: 3, Moved: &moved}}}},
		"replay-consumer": {
			{UniqueEventsPerSec: 80, ExactlyOnce: true, RestartRecoveryMs: 3000},
			{UniqueEventsPerSec: 95, ExactlyOnce: true, RestartRecoveryMs: 1000},
			{UniqueEventsPerSec: 85, ExactlyOnce: true, RestartRecoveryMs: 2000},
		},
		"steady-classic": {{UniqueEventsPerSec: 100, ExactlyOnce: true}},
	}
	ps := summarize(o, rounds)
	if len(ps) != 2 || ps[0].Protocol != "classic" || ps[1].Protocol != "consumer" {
		t.Fatalf("summaries %+v, want classic then consumer", ps)
	}
	c := ps[1]
	if c.StormVsSteady != 0.9 || c.ReplayVsSteady != 0.85 {
		t.Errorf("storm %.2f×, replay %.2f× steady; want 0.90× and 0.85× (the median round)", c.StormVsSteady, c.ReplayVsSteady)
	}
	if c.ReplayRestartMs != 2000 || c.ReplayRestartRounds != 3 {
		t.Errorf("replay's recovery after restart %v ms over %d rounds, want the rounds' median 2000 over 3", c.ReplayRestartMs, c.ReplayRestartRounds)
	}
	if c.StormChanges["restart"] != 1 || c.StormChanges["join"] != 1 || c.StaticHeld != 3 || c.StaticMoved == nil || *c.StaticMoved != 1 {
		t.Errorf("storm changes %v, static moved %v of %d; want one of each kind, 1 of 3", c.StormChanges, c.StaticMoved, c.StaticHeld)
	}
	var b strings.Builder
	writeProtocols(&b, &Report{Protocols: ps})
	if !strings.Contains(b.String(), "| consumer | 100 | 90 (0.90×) | 1 join, 1 leave, 1 restart |") {
		t.Errorf("the protocols' table lacks consumer's row:\n%s", b.String())
	}
}

// A replay's recovery counts from the group's restart, on records
// consumed (the re-read applies nothing), against the rate before the
// stop; a stream that ends first measures nothing.
func TestRestartRecovery(t *testing.T) {
	var ss []Sample
	consumed := int64(0)
	for i := 0; i <= 40; i++ { // 0.25 s apart
		tt := float64(i) / 4
		switch {
		case tt <= 3: // 1000 records/s before the stop at 3 s
			consumed += 250
		case tt < 4: // stopped, rewound, restarted at 3.5 s; slow until 4.5 s
		case tt < 4.5:
			consumed += 100
		default:
			consumed += 250
		}
		ss = append(ss, Sample{T: tt, Consumed: consumed})
	}
	got := restartRecovery(ss, Mark{T: 3, Kind: "reset", Took: 0.5})
	if got < 1000 || got > 1500 {
		t.Errorf("recovery %v ms after the restart at 3.5 s, want 1000–1500 (back at full rate from 4.5 s, over a 500 ms window)", got)
	}
	if got := restartRecovery(ss[:17], Mark{T: 3, Kind: "reset", Took: 0.5}); got != 0 {
		t.Errorf("a stream that ends before the rate is back: %v ms, want 0", got)
	}
}
