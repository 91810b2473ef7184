package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

func writeBacklog(dir string, rep *BacklogReport) error {
	if err := writeJSON(filepath.Join(dir, "results.json"), rep); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(backlogMarkdown(rep)), 0o644); err != nil {
		return err
	}
	if len(rep.Samples) < 2 {
		return nil
	}
	if err := plotBySize(filepath.Join(dir, "rate-by-size.png"), rep); err != nil {
		return fmt.Errorf("plot rate by size: %w", err)
	}
	if err := plotRSS(filepath.Join(dir, "rss.png"), rep); err != nil {
		return fmt.Errorf("plot rss: %w", err)
	}
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func backlogMarkdown(rep *BacklogReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Command: `%s`  \nBuild: %s  \nMachine: %s  \nBroker: %s; %d partitions; handlers: %s; started %s  \n",
		rep.Command, or(rep.Build, "not recorded"), rep.Machine, rep.Broker, rep.Partitions, strings.Join(rep.Handlers, ", "), rep.StartedAt.Format("2006-01-02 15:04 UTC"))
	keys := make([]string, 0, len(rep.Postgres))
	for k := range rep.Postgres {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var pg []string
	for _, k := range keys {
		pg = append(pg, k+"="+rep.Postgres[k])
	}
	fmt.Fprintf(&b, "Postgres: %s  \n", strings.Join(pg, ", "))
	env := "defaults"
	if len(rep.MemberEnv) > 0 {
		env = "`" + strings.Join(rep.MemberEnv, " ") + "`"
	}
	fmt.Fprintf(&b, "Member: one `onceflow run`, settings %s\n\n", env)
	if p := rep.Prefill; p.Rows > 0 {
		where := "the slice the run claims into"
		if p.Older {
			where = "an older dedup slice: the run claims into a new one and probes it"
		}
		if p.Warmed {
			where += fmt.Sprintf("; its indexes read into shared_buffers before the run, in %.0f s", p.WarmSeconds)
		} else {
			where += "; the run starts on a cold cache"
		}
		fmt.Fprintf(&b, "Pre-fill: %d processed_events rows (%d events, %d emails_sent rows, ids %s, indexes built at fillfactor %d; %s) in %.0f s. ",
			p.Rows, p.Events, p.Emails, p.IDs, p.IndexFillfactor, where, p.Seconds)
	} else {
		fmt.Fprintf(&b, "No pre-fill (empty tables), ids %s. ", p.IDs)
	}
	fmt.Fprintf(&b, "Backlog: %d records (%d unique events), produced in %.0f s.\n\n", rep.Records, rep.UniqueEvents, rep.ProduceSecs)
	once := "yes"
	if !rep.ExactlyOnce {
		once = fmt.Sprintf("**no** (%d problems)", len(rep.Problems))
	}
	fmt.Fprintf(&b, "| seconds | unique events/s | records/s | peak RSS (VmHWM) MiB | max sampled RSS MiB | hold (last span / first) | exactly once |\n|---:|---:|---:|---:|---:|---:|---|\n")
	fmt.Fprintf(&b, "| %.1f | %.0f | %.0f | %.0f | %.0f | %.2f | %s |\n\n", rep.Seconds, rep.EventsPerSec, rep.RecordsPerSec,
		rep.PeakRSSMiB, rep.MaxSampledRSS, rep.HoldRatio, once)
	b.WriteString("Rate against dedup table size:\n\n| processed_events rows | seconds | unique events/s | records/s | table MiB | index MiB | max RSS MiB |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rep.BySize {
		fmt.Fprintf(&b, "| %s – %s | %.1f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", rowsLabel(s.RowsFrom), rowsLabel(s.RowsTo),
			s.Seconds, s.EventsPerSec, s.RecordsPerSec, s.TableMiB, s.IndexMiB, s.MaxRSSMiB)
	}
	if len(rep.BySize) == 0 {
		b.WriteString("\nNo spans: the run's steady part was shorter than two samples (raise -records or lower -sample).\n")
	} else {
		fmt.Fprintf(&b, "\nMedian span: %.0f unique events/s.", rep.MedianEventsPerSec)
	}
	if ref := rep.Reference; ref != nil && len(rep.BySize) > 0 {
		fmt.Fprintf(&b, " Reference `%s` (%d pre-filled rows): %.0f unique events/s; this run is **%.2f×** it.",
			ref.Path, ref.PrefillRows, ref.MedianEventsPerSec, ref.Ratio)
	}
	b.WriteString("\n")
	if r := rep.RawCopy; r != nil {
		fmt.Fprintf(&b, "\nRaw COPY on the same tables afterwards: %d unique events in %.1f s = %.0f events/s (rows as expected: %v); "+
			"the member's median span is **%.2f×** it.\n", r.UniqueEvents, r.Seconds, r.UniqueEventsPerSec, r.ExactlyOnce, rep.RatioRawCopy)
	}
	if len(rep.Samples) > 0 {
		last := rep.Samples[len(rep.Samples)-1]
		fmt.Fprintf(&b, "\nAt the end: processed_events %.0f MiB heap + %.0f MiB indexes; emails_sent %.0f MiB with its indexes.\n",
			mib(last.TableBytes), mib(last.IndexBytes), mib(last.BusinessBytes))
	}
	b.WriteString("\nunique events/s: events applied (onceflow_events_applied_total / handlers) per second; records/s: records " +
		"committed (sum of sink_offsets.next_offset) per second, redeliveries included. Whole-run rates include the member's " +
		"start-up and tail; the spans run from the first sample with anything applied to the last before a partition was done. Peak RSS: the member process's VmHWM when the last record " +
		"committed, before it drains. The raw copy writes fresh unique events (processed_events and emails_sent by binary COPY, " +
		"counters by set-based upserts, 4 connections (the member's pool_size), 1000 events per transaction) into the tables as the run left them.\n")
	return b.String()
}

func rowsLabel(n int64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.2f M", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0f k", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// plotBySize draws the applied rate (over a 3-second window) against the
// dedup table's rows, with the spans' rates as steps.
func plotBySize(path string, rep *BacklogReport) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("onceflow run: rate against dedup table size (%s ids, %s)", rep.Prefill.IDs, strings.Join(rep.Handlers, ", "))
	p.X.Label.Text = "processed_events rows (millions)"
	p.Y.Label.Text = "unique events/s"
	hs := float64(max(len(rep.Handlers), 1))
	const window = 3.0 // seconds
	var pts plotter.XYs
	s := rep.Samples
	maxY := 1.0
	for i := 1; i < len(s); i++ {
		j := i - 1
		for j > 0 && s[j-1].T >= s[i].T-window {
			j--
		}
		if dt := s[i].T - s[j].T; dt > 0 && s[j].Applied > 0 {
			y := float64(s[i].Applied-s[j].Applied) / hs / dt
			pts = append(pts, plotter.XY{X: float64(s[i].DedupRows) / 1e6, Y: y})
			maxY = max(maxY, y)
		}
	}
	for _, r := range rep.BySize {
		maxY = max(maxY, r.EventsPerSec)
	}
	if rep.RawCopy != nil {
		maxY = max(maxY, rep.RawCopy.UniqueEventsPerSec)
	}
	var steps plotter.XYs
	for _, r := range rep.BySize {
		steps = append(steps, plotter.XY{X: float64(r.RowsFrom) / 1e6, Y: r.EventsPerSec}, plotter.XY{X: float64(r.RowsTo) / 1e6, Y: r.EventsPerSec})
	}
	if len(pts) > 0 {
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color, l.Width = color.RGBA{R: 0xaa, G: 0xaa, B: 0xaa, A: 255}, vg.Points(1)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%.0f s window", window), l)
	}
	if len(steps) > 0 {
		l, err := plotter.NewLine(steps)
		if err != nil {
			return err
		}
		l.Color, l.Width = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, vg.Points(2)
		p.Add(l)
		p.Legend.Add("per span of equal growth", l)
	}
	if rc := rep.RawCopy; rc != nil && len(s) > 0 {
		x := float64(s[len(s)-1].DedupRows) / 1e6
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: rc.UniqueEventsPerSec}, {X: x + float64(rc.UniqueEvents*len(rep.Handlers))/1e6, Y: rc.UniqueEventsPerSec}})
		if err != nil {
			return err
		}
		l.Color, l.Width = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255}, vg.Points(2)
		p.Add(l)
		p.Legend.Add("raw COPY, same tables", l)
	}
	p.Legend.Left = true // bottom left: below the rates
	p.Y.Min, p.Y.Max = 0, maxY*1.1
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}

// plotRSS draws the member's RSS over time.
func plotRSS(path string, rep *BacklogReport) error {
	var pts plotter.XYs
	for _, s := range rep.Samples {
		pts = append(pts, plotter.XY{X: s.T, Y: s.RSSMiB})
	}
	return plotLine(path, fmt.Sprintf("onceflow run: resident memory (peak %.0f MiB)", rep.PeakRSSMiB), "VmRSS MiB", pts)
}

// plotLine draws one series over seconds, from a y of 0, 9×3 inches.
func plotLine(path, title, ylabel string, pts plotter.XYs) error {
	if len(pts) == 0 {
		return fmt.Errorf("%s: no samples to plot", path)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = ylabel
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color, l.Width = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, vg.Points(1.5)
	p.Add(l)
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 3*vg.Inch, path)
}
