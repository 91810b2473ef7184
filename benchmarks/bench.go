package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// Run is one scenario's or baseline's result.
type Run struct {
	Name               string   `json:"name"`
	Kind               string   `json:"kind"` // scenario | baseline
	Records            int      `json:"records"`
	UniqueEvents       int      `json:"unique_events"`
	Seconds            float64  `json:"seconds"`
	UniqueEventsPerSec float64  `json:"unique_events_per_sec"`
	RecordsPerSec      float64  `json:"records_consumed_per_sec"`
	RecordsConsumed    int64    `json:"records_consumed"`
	SkippedLRU         int64    `json:"skipped_lru"`
	SkippedPostgres    int64    `json:"skipped_postgres"`
	BatchP50Ms         float64  `json:"batch_p50_ms"`
	BatchP99Ms         float64  `json:"batch_p99_ms"`
	Changes            int      `json:"membership_changes"`
	RecoveryMedianMs   float64  `json:"recovery_median_ms"`
	RecoveryMaxMs      float64  `json:"recovery_max_ms"`
	PeakRSSMiB         float64  `json:"peak_rss_mib"`
	ExactlyOnce        bool     `json:"exactly_once"`
	Problems           []string `json:"problems"`
	Samples            []Sample `json:"samples"`
	Marks              []Mark   `json:"marks"`
}

// Sample is the state at one moment of a run.
type Sample struct {
	T               float64 `json:"t"` // seconds since the run started
	Applied         int64   `json:"applied"`
	Consumed        int64   `json:"consumed"`
	SkippedLRU      int64   `json:"skipped_lru"`
	SkippedPostgres int64   `json:"skipped_postgres"`
}

// Mark is a membership change or an offset reset.
type Mark struct {
	T    float64 `json:"t"`
	Kind string  `json:"kind"` // join | leave | crash | reset
}

type bench struct {
	o   options
	log *slog.Logger
}

// env is one run's topic, group and schema.
type env struct {
	brokers []string
	topic   string
	group   string
	schema  string
	pool    *pgxpool.Pool
	close   func()
}

func (b *bench) newEnv(ctx context.Context, name string) (*env, error) {
	var r [3]byte
	_, _ = rand.Read(r[:])
	suffix := strings.ReplaceAll(name, "-", "_") + "_" + hex.EncodeToString(r[:])
	e := &env{topic: "bench-" + suffix, group: "bench-" + suffix, schema: "bench_" + suffix}
	var closers []func()
	e.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	pc, err := pgxpool.ParseConfig(b.o.dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(b.o.poolSize)
	e.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() {
		_, _ = e.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{e.schema}.Sanitize()+` CASCADE`)
		e.pool.Close()
	})
	if err := sink.Migrate(ctx, e.pool, e.schema); err != nil {
		e.close()
		return nil, err
	}
	if err := orders.Migrate(ctx, e.pool, e.schema); err != nil {
		e.close()
		return nil, err
	}
	if b.o.brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(b.o.partitions), e.topic),
			kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			e.close()
			return nil, err
		}
		closers = append(closers, c.Close)
		e.brokers = c.ListenAddrs()
		return e, nil
	}
	e.brokers = strings.Split(b.o.brokers, ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		e.close()
		return nil, err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(b.o.partitions), 1, nil, e.topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		e.close()
		return nil, fmt.Errorf("create topic: %w", err)
	}
	closers = append(closers, func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
		if err == nil {
			_, _ = kadm.NewClient(cl).DeleteTopics(context.Background(), e.topic)
			cl.Close()
		}
	})
	return e, nil
}

// preload publishes the stream before any consumer starts.
func (e *env) preload(ctx context.Context, msgs []orders.Message) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<17))
	if err != nil {
		return err
	}
	defer cl.Close()
	const chunk = 20000
	for i := 0; i < len(msgs); i += chunk {
		part := msgs[i:min(i+chunk, len(msgs))]
		recs := make([]*kgo.Record, len(part))
		for j, m := range part {
			recs[j] = wire.NewRecord(e.topic, m.ID, m.Value)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) committed(ctx context.Context) (int64, error) {
	var n int64
	err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+
		pgx.Identifier{e.schema, "sink_offsets"}.Sanitize()+` WHERE consumer_group = $1`, e.group).Scan(&n)
	return n, err
}

// group runs members of one consumer group and keeps every member's stats
// and every batch's duration.
type group struct {
	b   *bench
	e   *env
	mu  sync.Mutex
	all []*member
	run []*member
	dur []time.Duration
	cfg func(*processor.Config)
}

type member struct {
	c      *processor.Consumer
	cancel context.CancelFunc
	done   chan error
}

func (g *group) start(ctx context.Context) error {
	hs, err := orders.Handlers(g.e.schema, g.b.o.handlers...)
	if err != nil {
		return err
	}
	cache, err := dedup.New(100000)
	if err != nil {
		return err
	}
	w, err := sink.New(g.e.pool, sink.Config{Schema: g.e.schema, Group: g.e.group, Handlers: hs, Cache: cache, Logger: g.b.log})
	if err != nil {
		return err
	}
	cfg := processor.Config{
		Brokers: g.e.brokers, Topics: []string{g.e.topic}, Group: g.e.group,
		ClientID: "bench-" + strconv.Itoa(len(g.all)+1), BatchMaxRecords: g.b.o.batch, BatchLinger: 20 * time.Millisecond,
		SessionTimeout: 3 * time.Second, RebalanceTimeout: 10 * time.Second, Logger: g.b.log,
		OnBatch: func(bi processor.BatchInfo) {
			g.mu.Lock()
			g.dur = append(g.dur, bi.Duration)
			g.mu.Unlock()
		},
		KafkaOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond), kgo.HeartbeatInterval(300 * time.Millisecond)},
	}
	if g.cfg != nil {
		g.cfg(&cfg)
	}
	c, err := processor.New(cfg, w)
	if err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m := &member{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(mctx) }()
	g.mu.Lock()
	g.all = append(g.all, m)
	g.run = append(g.run, m)
	g.mu.Unlock()
	return nil
}

// stopOldest stops the longest-running member, cleanly or as a crash.
func (g *group) stopOldest(crash bool) {
	g.mu.Lock()
	if len(g.run) == 0 {
		g.mu.Unlock()
		return
	}
	m := g.run[0]
	g.run = g.run[1:]
	g.mu.Unlock()
	if crash {
		m.c.Abort()
	} else {
		m.cancel()
	}
	<-m.done
	m.cancel()
}

func (g *group) stopAll() {
	for {
		g.mu.Lock()
		n := len(g.run)
		g.mu.Unlock()
		if n == 0 {
			return
		}
		g.stopOldest(false)
	}
}

func (g *group) stats() processor.Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	var s processor.Stats
	for _, m := range g.all {
		s = s.Plus(m.c.Stats())
	}
	return s
}

// scenario runs one of steady, storm and replay.
func (b *bench) scenario(ctx context.Context, name string) (*Run, error) {
	stream, err := orders.Generate(b.o.events, b.o.duplicates, b.o.seed)
	if err != nil {
		return nil, err
	}
	e, err := b.newEnv(ctx, name)
	if err != nil {
		return nil, err
	}
	defer e.close()
	progress("%s: pre-loading %d records (%d unique events)", name, len(stream.Messages), len(stream.Unique))
	if err := e.preload(ctx, stream.Messages); err != nil {
		return nil, err
	}
	total := int64(len(stream.Messages))
	r := &Run{Name: name, Kind: "scenario", Records: len(stream.Messages), UniqueEvents: len(stream.Unique)}
	g := &group{b: b, e: e}
	resetPeakRSS()
	start := time.Now()
	since := func() float64 { return time.Since(start).Seconds() }
	for range b.o.members {
		if err := g.start(ctx); err != nil {
			return nil, err
		}
	}
	sample := time.NewTicker(250 * time.Millisecond)
	defer sample.Stop()
	var storm <-chan time.Time
	if name == "storm" {
		t := time.NewTicker(b.o.stormEvery)
		defer t.Stop()
		storm = t.C
	}
	changes, reset := 0, false
	lastLog := time.Now()
	for {
		select {
		case <-ctx.Done():
			g.stopAll()
			return nil, ctx.Err()
		case <-storm:
			changes++
			switch changes % 3 {
			case 1: // join
				if err := g.start(ctx); err != nil {
					return nil, err
				}
				r.Marks = append(r.Marks, Mark{since(), "join"})
			case 2: // leave
				g.stopOldest(false)
				r.Marks = append(r.Marks, Mark{since(), "leave"})
			case 0: // crash, and a replacement joins
				g.stopOldest(true)
				r.Marks = append(r.Marks, Mark{since(), "crash"})
				if err := g.start(ctx); err != nil {
					return nil, err
				}
			}
		case <-sample.C:
			s := g.stats()
			r.Samples = append(r.Samples, Sample{since(), s.Applied, s.RecordsConsumed, s.SkippedLRU, s.SkippedPostgres})
			done, err := e.committed(ctx)
			if err != nil {
				return nil, err
			}
			if time.Since(lastLog) > 2*time.Second {
				progress("%s: %5.1fs committed %d/%d records, applied %d, skipped lru %d postgres %d",
					name, since(), done, total, s.Applied, s.SkippedLRU, s.SkippedPostgres)
				lastLog = time.Now()
			}
			if name == "replay" && !reset && done >= total/2 {
				reset = true
				r.Marks = append(r.Marks, Mark{since(), "reset"}) // the stop is part of what recovers
				if err := b.rewind(ctx, g, e); err != nil {
					return nil, err
				}
				continue
			}
			if done >= total && (name != "replay" || reset) {
				r.Seconds = since()
				g.stopAll()
				return b.finish(ctx, r, g, e, stream)
			}
		}
	}
}

// rewind stops the group, moves its Kafka and Postgres offsets back to the
// start of every partition, and starts it again: every record is read once
// more, and dedup must apply none of them twice.
func (b *bench) rewind(ctx context.Context, g *group, e *env) error {
	n := len(g.run)
	g.stopAll()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	offsets := kadm.Offsets{}
	for p := range b.o.partitions {
		offsets.Add(kadm.Offset{Topic: e.topic, Partition: int32(p), At: 0, LeaderEpoch: -1})
	}
	resp, err := kadm.NewClient(cl).CommitOffsets(ctx, e.group, offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("rewind kafka offsets: %w", err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE `+pgx.Identifier{e.schema, "sink_offsets"}.Sanitize()+
		` SET next_offset = 0 WHERE consumer_group = $1`, e.group); err != nil {
		return fmt.Errorf("rewind stored offsets: %w", err)
	}
	for range n {
		if err := g.start(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) finish(ctx context.Context, r *Run, g *group, e *env, stream orders.Stream) (*Run, error) {
	s := g.stats()
	r.RecordsConsumed, r.SkippedLRU, r.SkippedPostgres = s.RecordsConsumed, s.SkippedLRU, s.SkippedPostgres
	r.UniqueEventsPerSec = float64(r.UniqueEvents) / r.Seconds
	r.RecordsPerSec = float64(r.RecordsConsumed) / r.Seconds
	g.mu.Lock()
	r.BatchP50Ms, r.BatchP99Ms = percentileMs(g.dur, 0.50), percentileMs(g.dur, 0.99)
	g.mu.Unlock()
	r.Changes = len(r.Marks)
	r.RecoveryMedianMs, r.RecoveryMaxMs = recovery(r)
	r.PeakRSSMiB = peakRSSMiB()
	rep, err := orders.Check(ctx, e.pool, e.schema, stream.Unique, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	r.ExactlyOnce, r.Problems = rep.ExactlyOnce(), rep.Problems
	if r.Problems == nil {
		r.Problems = []string{}
	}
	progress("%s: %d unique events in %.1fs = %.0f events/s, %.0f records/s; exactly once: %v",
		r.Name, r.UniqueEvents, r.Seconds, r.UniqueEventsPerSec, r.RecordsPerSec, r.ExactlyOnce)
	return r, nil
}

func percentileMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Millisecond)
}

// recovery measures, for each mark, the time until the applied rate over a
// sampling window is back to half the rate of the two seconds before it.
func recovery(r *Run) (median, maxMs float64) {
	var rs []float64
	rate := func(i int) float64 {
		dt := r.Samples[i].T - r.Samples[i-1].T
		return float64(r.Samples[i].Applied-r.Samples[i-1].Applied) / dt
	}
	for _, m := range r.Marks {
		var before []float64
		after := -1
		for i := 1; i < len(r.Samples); i++ {
			t := r.Samples[i].T
			if t <= m.T && t > m.T-2 {
				before = append(before, rate(i))
			}
			if t > m.T && after < 0 {
				after = i
			}
		}
		if len(before) == 0 || after < 0 {
			continue
		}
		var sum float64
		for _, v := range before {
			sum += v
		}
		target := 0.5 * sum / float64(len(before))
		for i := after; i < len(r.Samples); i++ {
			if rate(i) >= target {
				rs = append(rs, (r.Samples[i].T-m.T)*1000)
				break
			}
		}
	}
	if len(rs) == 0 {
		return 0, 0
	}
	slices.Sort(rs)
	return rs[len(rs)/2], rs[len(rs)-1]
}

// resetPeakRSS clears the kernel's peak-RSS mark of this process.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

func peakRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kb, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}
