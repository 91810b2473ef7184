package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

func writeOutputs(dir string, rep *Report) error {
	if err := writeJSON(filepath.Join(dir, "results.json"), rep); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(markdown(rep)), 0o644); err != nil {
		return err
	}
	for _, r := range rep.Runs {
		if r.Kind != "scenario" || len(r.Samples) < 2 {
			continue
		}
		if err := plotRun(filepath.Join(dir, "throughput-"+r.Name+".png"), r, len(rep.Handlers)); err != nil {
			return fmt.Errorf("plot %s: %w", r.Name, err)
		}
	}
	return nil
}

func markdown(rep *Report) string {
	var b strings.Builder
	crash := "aborted (its client leaves the group as it closes)" // -crash abort, and reports older than -crash
	if rep.Crash == "kill" {
		crash = "killed (as SIGKILL: it stays in the group until its session times out)"
	}
	fmt.Fprintf(&b, "Command: `%s`  \nBuild: %s  \nMachine: %s  \nBroker: %s; group protocol: %s; handlers: %s; a storm's crashed member is %s; started %s\n\n",
		rep.Command, or(rep.Build, "not recorded"), rep.Machine, rep.Broker, or(rep.GroupProtocol, "classic"), strings.Join(rep.Handlers, ", "), crash,
		rep.StartedAt.Format("2006-01-02 15:04 UTC"))
	b.WriteString("| run | records | unique events | seconds | unique events/s | records consumed/s | skipped LRU / Postgres | batch p50 / p99 ms | changes | recovery median / max ms | checkpoints | peak RSS MiB | exactly once |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rep.Runs {
		once := "yes"
		if !r.ExactlyOnce {
			once = fmt.Sprintf("**no** (%d problems)", len(r.Problems))
		}
		rec := "–"
		if r.Changes > 0 {
			rec = fmt.Sprintf("%.0f / %.0f", r.RecoveryMedianMs, r.RecoveryMaxMs)
		}
		cps := "–"
		if r.Checkpoints != nil {
			cps = fmt.Sprint(*r.Checkpoints)
			if !r.FromCheckpoint {
				cps += " (not from one)"
			}
		}
		fmt.Fprintf(&b, "| %s (%s) | %d | %d | %.1f | %.0f | %.0f | %d / %d | %.1f / %.1f | %d | %s | %s | %.0f | %s |\n",
			r.Name, r.Kind, r.Records, r.UniqueEvents, r.Seconds, r.UniqueEventsPerSec, r.RecordsPerSec,
			r.SkippedLRU, r.SkippedPostgres, r.BatchP50Ms, r.BatchP99Ms, r.Changes, rec, cps, r.PeakRSSMiB, once)
	}
	writeProtocols(&b, rep)
	writeFirstDone(&b, rep)
	writeRounds(&b, rep)
	writeFormatRatios(&b, rep)
	if len(rep.Ratios) > 0 {
		b.WriteString("\n| scenario | vs raw-copy | vs ceiling | vs per-record-dedup | vs naive-per-record |\n|---|---:|---:|---:|---:|\n")
		byScenario := map[string]map[string]float64{}
		var order []string
		for _, x := range rep.Ratios {
			if byScenario[x.Scenario] == nil {
				byScenario[x.Scenario] = map[string]float64{}
				order = append(order, x.Scenario)
			}
			byScenario[x.Scenario][x.Baseline] = x.Ratio
		}
		for _, s := range order {
			m := byScenario[s]
			fmt.Fprintf(&b, "| %s | %.2f× | %.2f× | %.1f× | %.1f× |\n", s, m["raw-copy"], m["ceiling"], m["per-record-dedup"], m["naive-per-record"])
		}
	}
	writeProfiles(&b, rep)
	b.WriteString("\nunique events/s: distinct events whose effects were applied, per second of the run (a scenario's ends at its last batch's COMMIT, a baseline's when its last write returns). " +
		"records consumed/s includes duplicates and re-reads. Batch latency: from a batch closing to its COMMIT. " +
		"Recovery: time from a membership change until the applied rate over the last 500 ms (wholly after the change) is back to 90% of the rate of the 2 s before it (changes after which the stream ended first are left out). " +
		"Checkpoints: those the server began during the run; each run starts right after a CHECKPOINT (unless \"not from one\": the role lacks pg_checkpoint), so runs that write the same WAL meet theirs at the same places. " +
		"Peak RSS: the whole benchmark process (kfake included when embedded). " +
		"The naive baseline is at-least-once: its \"no\" is the doubled effects of duplicates.\n")
	return b.String()
}

// writeFirstDone gives the rate of the runs until their first partition
// was done, and how long the rest took.
func writeFirstDone(b *strings.Builder, rep *Report) {
	var parts []string
	for _, r := range rep.Runs {
		if r.FirstDoneSeconds > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f events/s until %.1f s, then %.1f s for the rest",
				r.Name, r.FirstDoneEventsPerSec, r.FirstDoneSeconds, r.Seconds-r.FirstDoneSeconds))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(b, "\nUntil the first partition was done (every partition still had work): %s.\n", strings.Join(parts, "; "))
	}
}

// writeRounds lists every round's rate of the runs that had several
// (-rounds), of which the table shows the median.
func writeRounds(b *strings.Builder, rep *Report) {
	head := false
	for _, r := range rep.Runs {
		if len(r.Rounds) < 2 {
			continue
		}
		if !head {
			fmt.Fprintf(b, "\nEach run with rounds is the median of its rounds by unique events/s (ratios are of medians); every round, in the order run:\n\n"+
				"| run | unique events/s of each round | spread (max/min) |\n|---|---|---:|\n")
			head = true
		}
		rates := make([]string, len(r.Rounds))
		lo, hi := r.Rounds[0], r.Rounds[0]
		for i, x := range r.Rounds {
			rates[i] = fmt.Sprintf("%.0f", x)
			lo, hi = min(lo, x), max(hi, x)
		}
		fmt.Fprintf(b, "| %s | %s | %.2f |\n", r.Name, strings.Join(rates, ", "), hi/lo)
	}
}

func plotRun(path string, r *Run, handlers int) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("onceflow %s: throughput over time (1 s windows)", r.Name)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "per second"
	applied, consumed := plotter.XYs{}, plotter.XYs{}
	maxY := 1.0
	// Rates over a one-second window (four samples): fetches arrive in
	// bursts, so shorter windows mostly show the bursts.
	const window = 4
	for i := 1; i < len(r.Samples); i++ {
		j := max(0, i-window)
		dt := r.Samples[i].T - r.Samples[j].T
		a := float64(r.Samples[i].Applied-r.Samples[j].Applied) / float64(max(handlers, 1)) / dt
		c := float64(r.Samples[i].Consumed-r.Samples[j].Consumed) / dt
		applied = append(applied, plotter.XY{X: r.Samples[i].T, Y: a})
		consumed = append(consumed, plotter.XY{X: r.Samples[i].T, Y: c})
		maxY = max(maxY, a, c)
	}
	la, err := plotter.NewLine(applied)
	if err != nil {
		return err
	}
	la.Color, la.Width = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, vg.Points(1.5)
	lc, err := plotter.NewLine(consumed)
	if err != nil {
		return err
	}
	lc.Color, lc.Width = color.RGBA{R: 0xaa, G: 0xaa, B: 0xaa, A: 255}, vg.Points(1)
	p.Add(lc, la)
	p.Legend.Add("unique events applied/s", la)
	p.Legend.Add("records consumed/s", lc)
	p.Legend.Top = true
	p.Legend.Left = true
	colors := map[string]color.RGBA{"join": {G: 0x99, A: 255}, "leave": {R: 0xff, G: 0x99, A: 255},
		"crash": {R: 0xd6, G: 0x27, B: 0x28, A: 255}, "reset": {R: 0x94, G: 0x67, B: 0xbd, A: 255}}
	seen := map[string]bool{}
	for _, m := range r.Marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.T, Y: 0}, {X: m.T, Y: maxY}})
		if err != nil {
			return err
		}
		l.Color = colors[m.Kind]
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(l)
		if !seen[m.Kind] {
			seen[m.Kind] = true
			p.Legend.Add(m.Kind, l)
		}
	}
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}

// writeProfiles writes the -spans measurements of each run that has them.
func writeProfiles(b *strings.Builder, rep *Report) {
	for _, r := range rep.Runs {
		if len(r.SpanStats) == 0 && r.CPU == nil {
			continue
		}
		batches := 0
		for _, s := range r.SpanStats {
			if s.Name == batchSpan {
				batches = s.Count
			}
		}
		fmt.Fprintf(b, "\n### %s: spans (%d batches, %.0f records consumed per batch)\n\n", r.Name, batches,
			float64(r.RecordsConsumed)/float64(max(batches, 1)))
		b.WriteString("| span | count | mean ms | p50 ms | p95 ms | total s | ms per batch |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range r.SpanStats {
			fmt.Fprintf(b, "| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", s.Name, s.Count, s.MeanMs, s.P50Ms, s.P95Ms, s.TotalMs/1000, s.PerBatchMs)
		}
		b.WriteString("\nSpans nest (onceflow.batch holds the transaction; dedup.claim holds \"batch start\" and \"query INSERT processed_events_s…\"; a handler holds its query), so totals do not add up. " +
			"\"query SELECT sink_offsets\" includes the harness's own progress polling.\n")
		if c := r.CPU; c != nil {
			fmt.Fprintf(b, "\nCPU during the run (%.1f s wall, %d cores = %.1f core-s): this process %.1f s; its Postgres backends %.1f s; "+
				"Postgres background processes %.1f s; broker %.1f s; the whole machine busy %.1f s (others' work included).\n",
				c.Seconds, c.MachineCores, c.Seconds*float64(c.MachineCores), c.Bench, c.Backends, c.PostgresBackground, c.Broker, c.MachineBusy)
		}
		if w := r.WAL; w != nil {
			fmt.Fprintf(b, "\nWAL written by the whole cluster during the run: %d records, %d full-page images, %.1f MiB.\n",
				w.Records, w.FPI, float64(w.Bytes)/(1<<20))
		}
		if len(r.PGTables) > 0 {
			b.WriteString("\n| table | inserted | updated (HOT) | dead | heap blocks read / hit | index blocks read / hit | size MiB |\n|---|---:|---:|---:|---:|---:|---:|\n")
			for _, t := range r.PGTables {
				fmt.Fprintf(b, "| %s | %d | %d (%d) | %d | %d / %d | %d / %d | %.1f |\n", t.Name, t.Inserted, t.Updated, t.HotUpdated, t.Dead,
					t.HeapRead, t.HeapHit, t.IdxRead, t.IdxHit, float64(t.Bytes)/(1<<20))
			}
		}
	}
}

// or is s, or def when s is empty (a results.json written before s existed).
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
