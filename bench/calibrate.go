// The baselines' writers: how many write at once, measured before the
// rounds unless Config.BaselineWriters says.

package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// CalibrationEvents is how many of the stream's first unique events each
// candidate count of baseline writers writes when Run measures which is
// the fastest (Config.BaselineWriters 0); a stream with fewer than
// MinCalibrationEvents is too short to tell them apart, and its baselines
// write on PoolSize writers.
const (
	CalibrationEvents    = 50_000
	MinCalibrationEvents = 10_000
)

// Calibration is one candidate's rate when Run measured the baselines'
// writers.
type Calibration struct {
	Baseline     string  `json:"baseline"`
	Writers      int     `json:"writers"`
	Events       int     `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	// FromCheckpoint: the candidate began right after a CHECKPOINT
	// (Config.Checkpoint, and the role may).
	FromCheckpoint bool `json:"from_checkpoint"`
}

// writerCounts are the counts of baseline writers Run tries with pool
// connections: pool, its half, its quarter, …, 1, each rounded down (3
// tries 3 and 1).
func writerCounts(pool int) []int {
	var ws []int
	for w := pool; w >= 1; w /= 2 {
		ws = append(ws, w)
	}
	return ws
}

// calibrate sets each baseline's writers (b.writers) and says them in
// res.Settings: Config.BaselineWriters when set; otherwise the fastest of
// writerCounts, each writing the stream's first CalibrationEvents events
// in a schema of its own, dropped after. A candidate that fails (a payload
// that does not apply, say) is not counted: the baseline's runs say the
// failure, with the payload.
func (b *benchRun) calibrate(ctx context.Context, res *Results) error {
	names := []string{EffectsOnly}
	if !b.cfg.NoRawCopy {
		names = append(names, RawCopy)
	}
	b.writers = map[string]int{}
	counts := writerCounts(b.cfg.PoolSize)
	n := min(len(b.recs.events), CalibrationEvents)
	by := "measured"
	switch {
	case b.cfg.BaselineWriters > 0:
		by = "set"
	case len(counts) == 1:
		by = "untimed: one connection"
	case n < MinCalibrationEvents:
		by = fmt.Sprintf("untimed: fewer than %d events", MinCalibrationEvents)
	}
	res.Settings.BaselineWritersBy = by
	for _, name := range names {
		b.writers[name] = b.cfg.PoolSize
		if by == "set" {
			b.writers[name] = b.cfg.BaselineWriters
		}
		if by != "measured" {
			continue
		}
		best := 0.0
		for _, w := range counts {
			rate, fromCP, err := b.trial(ctx, name, w, n)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				continue
			}
			res.Settings.Calibration = append(res.Settings.Calibration, Calibration{Baseline: name, Writers: w, Events: n, EventsPerSec: rate, FromCheckpoint: fromCP})
			if rate > best {
				best, b.writers[name] = rate, w
			}
		}
	}
	res.Settings.BaselineWriters = b.writers
	fmt.Fprintf(b.cfg.Progress, "  baselines' writers (%s): %s\n", writersHow(res.Settings), calibrationLine(res.Settings))
	return nil
}

// writersHow says how st's baselines' writers were chosen.
func writersHow(st Settings) string {
	switch {
	case len(st.Calibration) > 0:
		s := fmt.Sprintf("the fastest over the first %s", count(st.Calibration[0].Events, "event"))
		if !slices.ContainsFunc(st.Calibration, func(c Calibration) bool { return !c.FromCheckpoint }) {
			s += ", each after a CHECKPOINT"
		}
		return s
	case st.BaselineWritersBy == "set":
		return "as set"
	case st.BaselineWritersBy != "":
		return st.BaselineWritersBy
	}
	return "the pool's connections"
}

// trial times the baseline name on w writers over the stream's first n
// events, in a schema of its own, after a CHECKPOINT under
// Config.Checkpoint, as each round; it reports whether one ran.
func (b *benchRun) trial(ctx context.Context, name string, w, n int) (rate float64, fromCheckpoint bool, err error) {
	schema := fmt.Sprintf("%s_%s_calib_%s_w%d", b.cfg.Schema, b.id, schemaWord(name), w)
	pool, err := b.iso.Create(ctx, schema, b.cfg.PoolSize)
	if err != nil {
		return 0, false, err
	}
	defer pool.Close() // the schemas are dropped below, --keep or not: none is the run's
	drop := func() error { return b.iso.Drop(context.WithoutCancel(ctx), schema) }
	hs, err := b.cfg.Handlers(schema)
	if err != nil {
		return 0, false, errors.Join(err, drop())
	}
	b.line.set("  %s on %s: %s", name, count(w, "writer"), count(n, "event"))
	hs = guardHandlers(hs, b.iso.guard(schema), nil)
	if fromCheckpoint, err = b.checkpoint(ctx); err != nil { // each candidate from one, as the rounds
		return 0, false, errors.Join(err, drop())
	}
	start := time.Now()
	if err := baseline(ctx, pool, schema, hs, b.recs.events[:n], b.batch(), w, name == RawCopy, b.cfg.Writer.Parse); err != nil {
		return 0, false, errors.Join(err, drop())
	}
	return float64(n) / time.Since(start).Seconds(), fromCheckpoint, drop()
}

// calibrationLine says each baseline's writers and, when they were
// measured, every candidate's rate.
func calibrationLine(st Settings) string {
	var parts []string
	for _, bw := range writersOf(st) {
		var tried []string
		for _, c := range st.Calibration {
			if c.Baseline == bw.name {
				tried = append(tried, fmt.Sprintf("%d: %.0f", c.Writers, c.EventsPerSec))
			}
		}
		p := bw.String()
		if len(tried) > 0 {
			p += " (events/s on " + strings.Join(tried, ", ") + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// baselineWriter is a baseline and its writers.
type baselineWriter struct {
	name    string
	writers int
}

func (bw baselineWriter) String() string { return fmt.Sprintf("%s %d", bw.name, bw.writers) }

// writersOf lists st's baselines' writers, effects-only first; results
// from before bench measured them wrote on the pool's connections.
func writersOf(st Settings) []baselineWriter {
	var out []baselineWriter
	for _, name := range []string{EffectsOnly, RawCopy} {
		w, ok := st.BaselineWriters[name]
		if !ok && st.BaselineWriters == nil {
			w, ok = st.PoolSize, st.PoolSize > 0
		}
		if ok {
			out = append(out, baselineWriter{name, w})
		}
	}
	return out
}
