package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gonum.org/v1/plot/plotter"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink"
)

// retentionOptions are the flags of `benchmarks retention`.
type retentionOptions struct {
	dsn        string
	horizon    time.Duration
	slices     int
	duration   time.Duration
	partitions int
	batch      int
	duplicates float64
	lru        int
	out        string
	seed       uint64
}

// RetentionSample is one second of a retention run.
type RetentionSample struct {
	T          float64 `json:"t"`            // seconds since the start
	Slices     int     `json:"slices"`       // live slices (partitions of processed_events)
	Rows       int64   `json:"rows"`         // processed_events rows
	SizeMiB    float64 `json:"size_mib"`     // processed_events, all partitions, indexes included
	AppliedPS  float64 `json:"applied_ps"`   // new events applied per second
	Duplicates int64   `json:"duplicates"`   // redeliveries sent this second
	Caught     int64   `json:"caught"`       // of them, skipped (LRU or Postgres)
	CaughtPG   int64   `json:"caught_by_pg"` // of them, skipped by Postgres
}

// RetentionReport is retention.json.
type RetentionReport struct {
	Command   string            `json:"command"`
	Build     string            `json:"build"` // see build
	Machine   string            `json:"machine"`
	StartedAt time.Time         `json:"started_at"`
	Horizon   string            `json:"horizon"`
	Slices    int               `json:"slices_per_horizon"`
	Width     string            `json:"slice_width"`
	Samples   []RetentionSample `json:"samples"`
	// Applied is the unique events applied; Duplicates the redeliveries
	// sent, each within half the horizon of its first delivery, and
	// HitRate the share of them skipped (1 is exact).
	Applied    int64   `json:"applied"`
	Duplicates int64   `json:"duplicates"`
	HitRate    float64 `json:"hit_rate"`
	// ExactlyOnce: every event's effect row exists exactly once.
	ExactlyOnce bool `json:"exactly_once"`
	// Cycles is how many times the table turned over (run time over
	// horizon plus slice width); FirstCycleMaxMiB and LaterMaxMiB are the
	// largest sizes in the second turn-over and after it: flat when equal.
	Cycles            float64 `json:"cycles"`
	FirstCycleMaxMiB  float64 `json:"first_cycle_max_mib"`
	LaterMaxMiB       float64 `json:"later_max_mib"`
	FirstCycleMaxRows int64   `json:"first_cycle_max_rows"`
	LaterMaxRows      int64   `json:"later_max_rows"`
	EventsPerSec      float64 `json:"events_per_sec"`
}

// mainRetention is `benchmarks retention`: sink.Writer (no Kafka) writing
// a steady stream with redeliveries while dedup.Retention keeps
// processed_events to a short horizon; every second, the table's size,
// rows and live slices, and how many redeliveries were caught.
func mainRetention(args []string) int {
	var o retentionOptions
	fs := flag.NewFlagSet("retention", flag.ContinueOnError)
	fs.StringVar(&o.dsn, "dsn", envOr("ONCEFLOW_POSTGRES_DSN", "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow?sslmode=disable"), "Postgres")
	fs.DurationVar(&o.horizon, "horizon", 20*time.Second, "dedup.retention")
	fs.IntVar(&o.slices, "slices", 1, "dedup.retention_slices")
	fs.DurationVar(&o.duration, "duration", 3*time.Minute, "how long to write (several horizons: the table turns over every horizon + slice width)")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions, one writer goroutine each")
	fs.IntVar(&o.batch, "batch", 1000, "records per batch")
	fs.Float64Var(&o.duplicates, "duplicates", 0.3, "share of each batch that redelivers an event first sent less than half the horizon ago")
	fs.IntVar(&o.lru, "lru", 0, "dedup LRU size; 0 (default) sends every redelivery to Postgres")
	fs.StringVar(&o.out, "out", "benchmarks/out/retention", "output directory")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the redelivery choices")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.horizon <= 0 || o.duration <= 0 || o.partitions < 1 || o.batch < 1 || o.duplicates < 0 || o.duplicates >= 1 {
		fmt.Fprintln(os.Stderr, "benchmarks retention: -horizon, -duration, -partitions and -batch must be positive, -duplicates in [0, 1)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := runRetention(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks retention:", err)
		return 1
	}
	if err := writeRetention(o.out, rep); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks retention:", err)
		return 1
	}
	progress("retention: %.1f turn-overs; size max %.1f MiB in the second, %.1f MiB after; hit rate %.4f; exactly once: %v; wrote %s",
		rep.Cycles, rep.FirstCycleMaxMiB, rep.LaterMaxMiB, rep.HitRate, rep.ExactlyOnce, o.out)
	if !rep.ExactlyOnce || rep.HitRate != 1 {
		return 1
	}
	return 0
}

// retentionRun is the state a retention run's goroutines share.
type retentionRun struct {
	o       retentionOptions
	pool    *pgxpool.Pool
	schema  string
	w       *sink.Writer
	applied atomic.Int64 // new events written (claimed or not: counted by the sender)
	dups    atomic.Int64
	caught  atomic.Int64
	caughtP atomic.Int64
}

func runRetention(ctx context.Context, o retentionOptions) (*RetentionReport, error) {
	pool, err := pgxpool.New(ctx, o.dsn)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	schema := fmt.Sprintf("bench_retention_%d", time.Now().UnixNano())
	defer func() {
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	}()
	if err := sink.Migrate(ctx, pool, schema); err != nil {
		return nil, err
	}
	effects := pgx.Identifier{schema, "applied"}.Sanitize()
	// The effect: a row per application, no unique key — a second
	// application of an event would show as a second row.
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (event_id uuid NOT NULL)`); err != nil {
		return nil, err
	}
	apply := sink.HandlerFunc("apply", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
		ids := make([][16]byte, len(events))
		for i, e := range events {
			ids[i] = e.ID
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` SELECT unnest($1::uuid[])`, ids)
		return err
	})
	cache, err := dedup.New(o.lru)
	if err != nil {
		return nil, err
	}
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "bench-retention", Handlers: []sink.Handler{apply}, Cache: cache})
	if err != nil {
		return nil, err
	}
	parts := make([]int32, o.partitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	leases, err := w.Take(ctx, "events", parts)
	if err != nil {
		return nil, err
	}
	ret := dedup.Retention{Pool: pool, Schema: schema, Horizon: o.horizon, Slices: o.slices,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if err := ret.Validate(); err != nil {
		return nil, err
	}
	rr := &retentionRun{o: o, pool: pool, schema: schema, w: w}
	rep := &RetentionReport{Command: "go run ./benchmarks retention " + strings.Join(redactDSN(os.Args[2:]), " "), Build: build(""), Machine: machine(),
		StartedAt: time.Now().UTC(), Horizon: o.horizon.String(), Slices: o.slices, Width: ret.Width().String()}
	progress("retention: horizon %v in %d slice(s) of %v, %d writers, %v", o.horizon, o.slices, ret.Width(), o.partitions, o.duration)

	// Goroutines owned here: the writers, the retention and the sampler,
	// all stopped and waited for before the checks.
	wctx, stopWriters := context.WithTimeout(ctx, o.duration)
	defer stopWriters()
	rctx, stopRetention := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { defer bg.Done(); _ = ret.Run(rctx) }()
	samples := make(chan []RetentionSample, 1)
	bg.Add(1)
	go func() { defer bg.Done(); samples <- rr.sample(rctx) }()

	start := time.Now()
	var writers sync.WaitGroup
	errs := make([]error, o.partitions)
	for p := range o.partitions {
		writers.Add(1)
		go func() { defer writers.Done(); errs[p] = rr.write(wctx, int32(p), leases[int32(p)]) }()
	}
	writers.Wait()
	elapsed := time.Since(start)
	stopRetention()
	bg.Wait()
	rep.Samples = <-samples
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	var rows, distinct int64
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+effects).Scan(&rows, &distinct); err != nil {
		return nil, err
	}
	rep.Applied, rep.Duplicates = rr.applied.Load(), rr.dups.Load()
	rep.ExactlyOnce = rows == distinct && distinct == rep.Applied
	if rep.Duplicates > 0 {
		rep.HitRate = float64(rr.caught.Load()) / float64(rep.Duplicates)
	}
	rep.EventsPerSec = float64(rep.Applied) / elapsed.Seconds()
	turn := (o.horizon + ret.Width()).Seconds()
	rep.Cycles = elapsed.Seconds() / turn
	for _, s := range rep.Samples {
		switch {
		case s.T >= turn && s.T < 2*turn:
			rep.FirstCycleMaxMiB = max(rep.FirstCycleMaxMiB, s.SizeMiB)
			rep.FirstCycleMaxRows = max(rep.FirstCycleMaxRows, s.Rows)
		case s.T >= 2*turn:
			rep.LaterMaxMiB = max(rep.LaterMaxMiB, s.SizeMiB)
			rep.LaterMaxRows = max(rep.LaterMaxRows, s.Rows)
		}
	}
	if !rep.ExactlyOnce {
		progress("retention: NOT exactly once: %d effect rows, %d distinct, %d events sent", rows, distinct, rep.Applied)
	}
	return rep, nil
}

// sent is an event first delivered at a time.
type sent struct {
	id uuid.UUID
	at time.Time
}

// write writes partition p's stream until ctx ends: batches of new events
// and redeliveries of events this partition first sent less than half the
// horizon ago (a broker redelivering, a rebalance replaying).
func (rr *retentionRun) write(ctx context.Context, p int32, lease sink.Lease) error {
	rng := rand.New(rand.NewPCG(rr.o.seed, uint64(p)))
	var history []sent // first deliveries, oldest first
	offset, fence := int64(0), int64(-1)
	for ctx.Err() == nil {
		now := time.Now()
		// Forget what is older than half the horizon: it is not redelivered.
		cut := 0
		for cut < len(history) && now.Sub(history[cut].at) > rr.o.horizon/2 {
			cut++
		}
		history = history[cut:]
		evs := make([]sink.Event, 0, rr.o.batch)
		var fresh, dups int64
		for range rr.o.batch {
			id := uuid.New()
			if len(history) > 0 && rng.Float64() < rr.o.duplicates {
				id = history[rng.IntN(len(history))].id
				dups++
			} else {
				history = append(history, sent{id, now})
				fresh++
			}
			evs = append(evs, sink.Event{ID: id, Topic: "events", Partition: p, Offset: offset, Value: []byte(`{}`)})
			offset++
		}
		res, err := rr.w.Write(context.WithoutCancel(ctx), &sink.Batch{Topic: "events", Partition: p, Epoch: lease.Epoch,
			Fence: fence, NextOffset: offset, Events: evs})
		if err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
		fence = offset
		rr.applied.Add(fresh)
		rr.dups.Add(dups)
		rr.caught.Add(int64(res.SkippedLRU + res.SkippedPostgres))
		rr.caughtP.Add(int64(res.SkippedPostgres))
	}
	return nil
}

// sample reads the table's size, rows and slices every second until ctx
// ends.
func (rr *retentionRun) sample(ctx context.Context) []RetentionSample {
	processed := pgx.Identifier{rr.schema, "processed_events"}.Sanitize()
	start := time.Now()
	var out []RetentionSample
	var lastApplied, lastDups, lastCaught, lastPG int64
	last := start
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		var s RetentionSample
		var size int64
		err := rr.pool.QueryRow(ctx, `SELECT count(*) - 1, coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
FROM pg_partition_tree($1::regclass)`, processed).Scan(&s.Slices, &size)
		if err == nil {
			err = rr.pool.QueryRow(ctx, `SELECT count(*) FROM `+processed).Scan(&s.Rows)
		}
		if err != nil {
			continue // the table is being rotated or the run ends: next second
		}
		now := time.Now()
		a, d, c, pg := rr.applied.Load(), rr.dups.Load(), rr.caught.Load(), rr.caughtP.Load()
		s.T, s.SizeMiB = now.Sub(start).Seconds(), mib(size)
		s.AppliedPS = float64(a-lastApplied) / now.Sub(last).Seconds()
		s.Duplicates, s.Caught, s.CaughtPG = d-lastDups, c-lastCaught, pg-lastPG
		lastApplied, lastDups, lastCaught, lastPG, last = a, d, c, pg, now
		out = append(out, s)
	}
}

// writeRetention writes retention.json, retention.md and retention.png.
func writeRetention(dir string, rep *RetentionReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "retention.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Dedup retention: processed_events size under steady load\n\n`%s` — build %s — %s, started %s.\n\n",
		rep.Command, or(rep.Build, "not recorded"), rep.Machine, rep.StartedAt.Format(time.RFC3339))
	fmt.Fprintf(&b, "Horizon %s in %d slice(s) of %s; %.1f turn-overs; %.0f new events/s; %d redeliveries (each within half the horizon), hit rate %.4f; exactly once: %v.\n\n",
		rep.Horizon, rep.Slices, rep.Width, rep.Cycles, rep.EventsPerSec, rep.Duplicates, rep.HitRate, rep.ExactlyOnce)
	fmt.Fprintf(&b, "Largest size in the second turn-over: %.1f MiB (%d rows); after it: %.1f MiB (%d rows).\n\n",
		rep.FirstCycleMaxMiB, rep.FirstCycleMaxRows, rep.LaterMaxMiB, rep.LaterMaxRows)
	b.WriteString("| t (s) | slices | rows | size MiB | new events/s | redeliveries | caught (Postgres) |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	every := max(len(rep.Samples)/30, 1)
	for i, s := range rep.Samples {
		if i%every == 0 || i == len(rep.Samples)-1 {
			fmt.Fprintf(&b, "| %.0f | %d | %d | %.1f | %.0f | %d | %d (%d) |\n", s.T, s.Slices, s.Rows, s.SizeMiB, s.AppliedPS, s.Duplicates, s.Caught, s.CaughtPG)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "retention.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return plotRetention(filepath.Join(dir, "retention.png"), rep)
}

// plotRetention draws the table's size over time.
func plotRetention(path string, rep *RetentionReport) error {
	var pts plotter.XYs
	for _, s := range rep.Samples {
		pts = append(pts, plotter.XY{X: s.T, Y: s.SizeMiB})
	}
	return plotLine(path, fmt.Sprintf("processed_events size, horizon %s in %d slice(s)", rep.Horizon, rep.Slices), "MiB (indexes included)", pts)
}
