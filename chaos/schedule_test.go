package main

import (
	"slices"
	"testing"
	"time"
)

func TestScheduleReplaysFromItsSeed(t *testing.T) {
	cfg := scheduleConfig{Kinds: allFaults, Window: 75 * time.Second, Gap: 3 * time.Second, SessionTimeout: 3 * time.Second}
	a, b := newSchedule(7, cfg), newSchedule(7, cfg)
	if !slices.Equal(a, b) {
		t.Fatalf("two schedules of seed 7 differ:\n%v\n%v", a, b)
	}
	if c := newSchedule(8, cfg); slices.Equal(a, c) {
		t.Fatalf("seeds 7 and 8 gave the same schedule %v", a)
	}
}

func TestScheduleCoversEveryKind(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      scheduleConfig
		minKills int
	}{
		{"short", scheduleConfig{Kinds: allFaults, Window: 75 * time.Second, Gap: 3 * time.Second, SessionTimeout: 3 * time.Second}, 0},
		{"long", scheduleConfig{Kinds: allFaults, Window: 30 * time.Minute, Gap: 6 * time.Second, MinKills: 250, SessionTimeout: 3 * time.Second}, 250},
		{"kills only", scheduleConfig{Kinds: []faultKind{faultKill}, Window: time.Minute, Gap: time.Second, SessionTimeout: time.Second}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 20; seed++ {
				s := newSchedule(seed, tc.cfg)
				n := map[faultKind]int{}
				var last time.Duration
				for _, f := range s {
					n[f.Kind]++
					if f.At < last || f.At >= tc.cfg.Window {
						t.Fatalf("seed %d: fault at %v after one at %v, or outside the window %v", seed, f.At, last, tc.cfg.Window)
					}
					last = f.At
					if !slices.Contains(tc.cfg.Kinds, f.Kind) {
						t.Fatalf("seed %d: fault %v of a kind not enabled", seed, f)
					}
					if f.Kind == faultStop && f.Pause <= tc.cfg.SessionTimeout {
						t.Fatalf("seed %d: stop of %v, not past the session timeout %v", seed, f.Pause, tc.cfg.SessionTimeout)
					}
				}
				for _, k := range tc.cfg.Kinds {
					if n[k] == 0 {
						t.Fatalf("seed %d: no %s fault in %d faults", seed, k, len(s))
					}
				}
				if n[faultKill] < tc.minKills {
					t.Fatalf("seed %d: %d kills, want at least %d", seed, n[faultKill], tc.minKills)
				}
			}
		})
	}
}

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []faultKind
		err  bool
	}{
		{"all", allFaults, false},
		{"none", nil, false},
		{"kill,stop,kill", []faultKind{faultKill, faultStop}, false},
		{"kill,explode", nil, true},
	} {
		got, err := parseFaults(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("parseFaults(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
}
