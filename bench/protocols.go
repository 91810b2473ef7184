package bench

import (
	"fmt"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/onceflow/onceflow/processor"
)

// ProtocolSummary compares one group protocol's scenarios: the median
// round of each (by rate, the lower middle, as Results.Summary's).
type ProtocolSummary struct {
	Protocol string  `json:"protocol"`
	Steady   float64 `json:"steady_events_per_sec,omitempty"`
	Storm    float64 `json:"storm_events_per_sec,omitempty"`
	Replay   float64 `json:"replay_events_per_sec,omitempty"`
	// StormVsSteady and ReplayVsSteady are the medians' ratios.
	StormVsSteady  float64 `json:"storm_vs_steady,omitempty"`
	ReplayVsSteady float64 `json:"replay_vs_steady,omitempty"`
	// StormRounds and ReplayRounds are the ratios round by round, each to
	// the steady run of its round (the runs of a round follow each other,
	// so a machine's drift over the rounds cancels); their medians are
	// the paired ratios, steadier than the medians' ratio where rounds
	// spread.
	StormRounds  []float64 `json:"storm_vs_steady_rounds,omitempty"`
	ReplayRounds []float64 `json:"replay_vs_steady_rounds,omitempty"`
	// StormChanges counts the median storm's changes by kind.
	StormChanges map[string]int `json:"storm_changes,omitempty"`
	StormShort   bool           `json:"storm_short,omitempty"`
	// StormRecoveryMs is the median over the rounds that measured a
	// recovery (StormRecoveryRounds of them; 0 for none) of each storm's
	// median recovery after a change; StormNoOwner and ReplayNoOwner the
	// median runs' waits with no owner.
	StormRecoveryMs     float64 `json:"storm_recovery_median_ms,omitempty"`
	StormRecoveryRounds int     `json:"storm_recovery_rounds,omitempty"`
	// StormRecoveryByKind is, for each kind of change, the median
	// recovery over every round's changes of that kind (those measured).
	StormRecoveryByKind map[string]float64 `json:"storm_recovery_by_kind_ms,omitempty"`
	// ReplayBackMs is the median over the rounds of the replay's time
	// back at 90 % of its records rate (RunResult.BackAtRateMs), of
	// ReplayBackRounds rounds that measured one.
	ReplayBackMs     float64  `json:"replay_back_at_rate_ms,omitempty"`
	ReplayBackRounds int      `json:"replay_back_rounds,omitempty"`
	StormNoOwner     *NoOwner `json:"storm_no_owner,omitempty"`
	ReplayNoOwner    *NoOwner `json:"replay_no_owner,omitempty"`
	// StaticMoved (Config.InstanceID): partitions of the median storm's
	// restarted static members that another member ran meanwhile, out
	// of StaticHeld.
	StaticMoved *int `json:"static_moved,omitempty"`
	StaticHeld  int  `json:"static_held,omitempty"`
}

// medianRun is the run of rs with the median rate (the lower middle).
func medianRun(rs []RunResult) *RunResult {
	if len(rs) == 0 {
		return nil
	}
	s := slices.Clone(rs)
	slices.SortStableFunc(s, func(a, b RunResult) int {
		switch {
		case a.EventsPerSec < b.EventsPerSec:
			return -1
		case a.EventsPerSec > b.EventsPerSec:
			return 1
		}
		return 0
	})
	return &s[(len(s)-1)/2]
}

// summarizeProtocols compares the protocols from res's runs.
func summarizeProtocols(res *Results, protocols []processor.GroupProtocol) []ProtocolSummary {
	var out []ProtocolSummary
	for _, p := range protocols {
		s := ProtocolSummary{Protocol: string(p)}
		runs := func(sc string) []RunResult {
			var rs []RunResult
			for _, r := range res.Runs {
				if r.Scenario == sc && r.GroupProtocol == string(p) && r.Format == "" {
					rs = append(rs, r)
				}
			}
			return rs
		}
		steadies := runs(Steady)
		if steady := medianRun(steadies); steady != nil {
			s.Steady = steady.EventsPerSec
		}
		// paired is each run's rate over its round's steady rate.
		paired := func(rs []RunResult) []float64 {
			var out []float64
			for _, r := range rs {
				for _, st := range steadies {
					if st.Round == r.Round && st.EventsPerSec > 0 {
						out = append(out, r.EventsPerSec/st.EventsPerSec)
					}
				}
			}
			return out
		}
		if rs := runs(Storm); len(rs) > 0 {
			storm := medianRun(rs)
			s.Storm, s.StormShort, s.StormNoOwner = storm.EventsPerSec, storm.StormShort, storm.NoOwner
			var rec []float64
			byKind := map[string][]float64{}
			for _, r := range rs {
				if r.RecoveryMeasured > 0 {
					rec = append(rec, r.RecoveryMedianMs)
				}
				for _, c := range r.Changes {
					if c.RecoveryMs > 0 {
						byKind[c.What] = append(byKind[c.What], c.RecoveryMs)
					}
				}
			}
			s.StormRecoveryMs, s.StormRecoveryRounds = median(rec), len(rec)
			s.StormRecoveryByKind = map[string]float64{}
			for k, v := range byKind {
				s.StormRecoveryByKind[k] = median(v)
			}
			s.StormChanges = map[string]int{}
			for _, c := range storm.Changes {
				s.StormChanges[c.What]++
			}
			s.StaticMoved, s.StaticHeld = storm.StaticMoved, storm.StaticHeld
			s.StormRounds = paired(rs)
			if s.Steady > 0 {
				s.StormVsSteady = s.Storm / s.Steady
			}
		}
		if rs := runs(Replay); len(rs) > 0 {
			replay := medianRun(rs)
			s.Replay, s.ReplayNoOwner = replay.EventsPerSec, replay.NoOwner
			var back []float64
			for _, r := range rs {
				if r.BackAtRateMs != nil {
					back = append(back, *r.BackAtRateMs)
				}
			}
			s.ReplayBackMs, s.ReplayBackRounds = median(back), len(back)
			s.ReplayRounds = paired(rs)
			if s.Steady > 0 {
				s.ReplayVsSteady = s.Replay / s.Steady
			}
		}
		out = append(out, s)
	}
	return out
}

// median is xs' median (the lower middle); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// writeProtocols writes the protocols' comparison into results.md.
func writeProtocols(b *strings.Builder, ps []ProtocolSummary) {
	if len(ps) == 0 {
		return
	}
	b.WriteString("\n### Group protocols side by side\n\n" +
		"| protocol | steady events/s | storm events/s (× steady) | storm × steady, paired by round (median: rounds) | storm changes | storm recovery median ms (by change) | storm: partition waits with no owner (n, median / max ms) | " +
		"replay events/s (× steady) | replay × steady, paired by round | replay back at 90 % ms | replay: partition waits with no owner | static restarts: partitions moved / held |\n" +
		"|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range ps {
		var kinds []string
		for _, k := range []string{"join", "leave", "kill", "restart"} {
			if n := s.StormChanges[k]; n > 0 {
				kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
			}
		}
		changes := strings.Join(kinds, ", ")
		if s.StormShort {
			changes = orDash(changes) + " (**fewer than planned: the stream ended first**; raise --events)"
		}
		static := "–"
		if s.StaticMoved != nil {
			static = fmt.Sprintf("%d / %d", *s.StaticMoved, s.StaticHeld)
		}
		storm := "– | – | – | – | –" // not run
		if s.Storm > 0 {
			var by []string
			for _, k := range []string{"join", "leave", "kill", "restart"} {
				if v, ok := s.StormRecoveryByKind[k]; ok {
					by = append(by, fmt.Sprintf("%s %.0f", k, v))
				}
			}
			rec := "– (none measured)"
			if s.StormRecoveryRounds > 0 {
				rec = fmt.Sprintf("%.0f", s.StormRecoveryMs)
			}
			if len(by) > 0 {
				rec += " (" + strings.Join(by, ", ") + ")"
			}
			storm = fmt.Sprintf("%.0f (%.2f×) | %s | %s | %s | %s", s.Storm, s.StormVsSteady, pairedCell(s.StormRounds), orDash(changes), rec, noOwner(s.StormNoOwner))
		}
		replay := "– | – | – | –"
		if s.Replay > 0 {
			back := "– (none measured)"
			if s.ReplayBackRounds > 0 {
				back = fmt.Sprintf("%.0f", s.ReplayBackMs)
			}
			replay = fmt.Sprintf("%.0f (%.2f×) | %s | %s | %s", s.Replay, s.ReplayVsSteady, pairedCell(s.ReplayRounds), back, noOwner(s.ReplayNoOwner))
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %s |\n", s.Protocol, s.Steady, storm, replay, static)
	}
	b.WriteString("\nRates and ratios are of each scenario's median round; the paired ratios are each round's run over that round's steady run " +
		"(the median, then each round's), where a machine's drift between rounds cancels; storm recovery times are medians " +
		"over the rounds that measured one (by change: the median over every round's changes of that kind, those measured), the replay's time back at 90 % of its records rate " +
		"(from the re-reading group's start) the median over the rounds; none is measured where the first group read for under two seconds, " +
		"or the rate came back only after the stream's end. " +
		"A wait with no owner runs from a partition's worker stopping on one member to one starting on any member (polled every 20 ms); " +
		"the replay's include its first group's stop and its second group's start.\n")
}

// pairedCell is paired ratios' median and the ratios round by round.
func pairedCell(rs []float64) string {
	if len(rs) == 0 {
		return "–"
	}
	var each []string
	for _, r := range rs {
		each = append(each, fmt.Sprintf("%.2f", r))
	}
	return fmt.Sprintf("%.2f×: %s", median(rs), strings.Join(each, " "))
}

func noOwner(n *NoOwner) string {
	if n == nil {
		return "–"
	}
	return fmt.Sprintf("%d, %.0f / %.0f", n.Waits, n.MedianMs, n.MaxMs)
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// build is the VCS revision this binary was built from ("+dirty" for a
// modified tree), else the onceflow module's version; "" when neither is
// known (a build with -buildvcs=false from a checkout, a test binary).
func build() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		if v := bi.Main.Version; v != "(devel)" {
			return v
		}
		return ""
	}
	return rev[:min(len(rev), 12)] + dirty
}
