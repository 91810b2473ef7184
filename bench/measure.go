package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// percentileMs is the q-quantile (0 to 1) of ds, in milliseconds; 0 for
// none.
func percentileMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Millisecond)
}

// recoveryShare is the share of the rate before a membership change that
// counts as recovered.
const recoveryShare = 0.9

// recoveryWindow is the span, in seconds, over which the rate after a
// change is measured; the window lies wholly after the change, so it is
// also the shortest recovery that can be measured.
const recoveryWindow = 0.5

// recovery measures, for each change, the time until the applied rate
// over the last recoveryWindow is back to recoveryShare of the rate
// before the change, and sets the change's RecoveryMs. The rate before
// is the greater of the rate over the two seconds before the change
// (when the series has a second before it at least) and the run's
// median rate up to it (over the samples' intervals since the first
// pair applied, two intervals at least): a change whose two seconds
// before were a stall is measured against the run's rate, not the
// stall's, and one in the run's first seconds against the rate so far.
// A change is not measured (RecoveryMs 0) when there is no rate before
// it (nothing applied for half a second yet) or when the stream ended
// before the rate came back; median and maxMs are over the measured
// changes, of which there are measured (0, 0, 0 for none).
func recovery(series []Sample, changes []Change) (median, maxMs float64, measured int) {
	var rs []float64
	for ci := range changes {
		c := &changes[ci]
		c.RecoveryMs = 0
		if ms, ok := backAtRate(series, c.Seconds, applied, medianRate(series, c.Seconds, applied)); ok {
			c.RecoveryMs = ms
			rs = append(rs, ms)
		}
	}
	if len(rs) == 0 {
		return 0, 0, 0
	}
	slices.Sort(rs)
	return rs[(len(rs)-1)/2], rs[len(rs)-1], len(rs)
}

// medianRate is the median (the lower middle) of value's rates over the
// intervals between the series' samples up to at, from the first
// interval in which value moved; 0 when there are fewer than two.
func medianRate(series []Sample, at float64, value func(Sample) int64) float64 {
	var rates []float64
	started := false
	for i := 1; i < len(series) && series[i].Seconds <= at; i++ {
		dv, dt := value(series[i])-value(series[i-1]), series[i].Seconds-series[i-1].Seconds
		if dv > 0 {
			started = true
		}
		if started && dt > 0 {
			rates = append(rates, float64(dv)/dt)
		}
	}
	if len(rates) < 2 {
		return 0
	}
	slices.Sort(rates)
	return rates[(len(rates)-1)/2]
}

func applied(s Sample) int64   { return s.Applied }
func committed(s Sample) int64 { return s.Committed }

// backAtRate is the time, in milliseconds, from at until the rate of
// value over recoveryWindow, a window wholly after at, is back to
// recoveryShare of its rate before at: the greater of its rate over the
// two seconds up to at (when the series has a second before at at least)
// and floor. It is false when it never is before the series ends, or
// when the rate before is 0. The windows after at measure from samples
// taken at or after it only, so a value that starts again from zero at
// at (the replay's second group's committed records) is measured from
// its own start.
func backAtRate(series []Sample, at float64, value func(Sample) int64, floor float64) (float64, bool) {
	// rate is value's rate over the samples in (t-d, t] ending at i,
	// from a sample taken at from or later.
	rate := func(i int, d, from float64) (float64, bool) {
		j := i
		for j > 0 && series[j-1].Seconds > series[i].Seconds-d {
			j--
		}
		if j == 0 || series[i].Seconds-series[j-1].Seconds < d/2 || series[j-1].Seconds < from {
			return 0, false
		}
		dt := series[i].Seconds - series[j-1].Seconds
		return float64(value(series[i])-value(series[j-1])) / dt, true
	}
	last, after := -1, -1
	for i, s := range series {
		if s.Seconds <= at {
			last = i
		} else if after < 0 {
			after = i
		}
	}
	if last < 0 || after < 0 {
		return 0, false
	}
	before, ok := rate(last, 2, math.Inf(-1))
	if !ok { // under a second of series before at: floor alone
		before = 0
	}
	before = max(before, floor)
	if before <= 0 {
		return 0, false
	}
	for i := after; i < len(series); i++ {
		if v, ok := rate(i, recoveryWindow, at); ok && series[i].Seconds-recoveryWindow >= at && v >= recoveryShare*before {
			return (series[i].Seconds - at) * 1000, true
		}
	}
	return 0, false
}

// resetPeakRSS clears the kernel's peak-RSS mark of this process (Linux;
// elsewhere it does nothing and peakRSSMiB reads 0).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSSMiB is this process's peak resident set since resetPeakRSS
// (VmHWM), in MiB; 0 where /proc is not.
func peakRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			kb, _ := strconv.ParseFloat(f[0], 64)
			return kb / 1024
		}
	}
	return 0
}

// checkpoints returns how many checkpoints the server has begun, timed or
// requested, since its statistics were reset.
func checkpoints(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column: PostgreSQL 17 moved them
		err = pool.QueryRow(ctx, `SELECT num_timed + num_requested FROM pg_stat_checkpointer`).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("read the checkpoints begun: %w", err)
	}
	return n, nil
}

// checkpointCounted waits until the checkpoints begun exceed before — the
// checkpointer counts a requested checkpoint after the CHECKPOINT that
// asked for it has returned — and returns the new count, so that the
// benchmark's own checkpoint does not count as one begun during the run.
// After two seconds it takes before + 1.
func checkpointCounted(ctx context.Context, pool *pgxpool.Pool, before int64) (int64, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := checkpoints(ctx, pool)
		if err != nil || n > before {
			return n, err
		}
		if time.Now().After(deadline) {
			return before + 1, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// checkpoint runs CHECKPOINT, so that a run starts where every run
// starts in the server's checkpoint cycle: right after one. A large run
// writes more WAL than max_wal_size's default of 1 GB, so the server
// checkpoints during runs wherever its cycle falls, and a checkpoint
// taxes the writes after it with full-page images (every index page of a
// random uuid key touched again). Started from a checkpoint, runs of the
// same WAL meet theirs at the same places. ok is false when the role may
// not checkpoint (it needs pg_checkpoint, PostgreSQL 15+, or superuser).
func checkpoint(ctx context.Context, pool *pgxpool.Pool) (ok bool, err error) {
	_, err = pool.Exec(ctx, `CHECKPOINT`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checkpoint: %w", err)
	}
	return true, nil
}
