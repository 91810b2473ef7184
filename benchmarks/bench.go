package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
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
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// Run is one scenario's or baseline's result.
type Run struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // scenario | baseline
	// Scenario is a scenario run's scenario (steady, storm, replay), and
	// GroupProtocol its members' group protocol; Name is the scenario's,
	// suffixed with the protocol when -group-protocol lists several.
	Scenario           string   `json:"scenario,omitempty"`
	GroupProtocol      string   `json:"group_protocol,omitempty"`
	Records            int      `json:"records"`
	UniqueEvents       int      `json:"unique_events"`
	Seconds            float64  `json:"seconds"`
	UniqueEventsPerSec float64  `json:"unique_events_per_sec"`
	RecordsPerSec      float64  `json:"records_consumed_per_sec"`
	RecordsConsumed    int64    `json:"records_consumed"`
	RecordsFetched     int64    `json:"records_fetched,omitempty"` // decoded from fetches, delivered or not (processor.Stats.RecordsFetched)
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
	// FromCheckpoint: the run began right after a CHECKPOINT (see
	// checkpoint); Checkpoints is how many the server began during it.
	FromCheckpoint bool `json:"from_checkpoint"`
	// FirstDoneSeconds is when the first partition had all its records
	// committed (steady and storm), and FirstDoneEventsPerSec the events
	// applied per second until then: the rate while every partition still
	// had work, before the tail in which the partitions left behind finish
	// alone.
	FirstDoneSeconds      float64 `json:"first_partition_done_s,omitempty"`
	FirstDoneEventsPerSec float64 `json:"events_per_sec_until_first_done,omitempty"`
	// Rounds is the unique events/s of every round of this run (-rounds),
	// in the order they ran; this run is their median.
	Rounds      []float64 `json:"rounds,omitempty"`
	Checkpoints *int64    `json:"checkpoints,omitempty"`
	// RoundsRecoveryMs and RoundsRestartRecoveryMs are every round's
	// RecoveryMedianMs and RestartRecoveryMs, in the order run.
	RoundsRecoveryMs        []float64 `json:"rounds_recovery_ms,omitempty"`
	RoundsRestartRecoveryMs []float64 `json:"rounds_restart_recovery_ms,omitempty"`
	// A storm's planned changes (-storm-changes); StormShort says the
	// stream was consumed before the last of them.
	StormPlanned int  `json:"storm_planned_changes,omitempty"`
	StormShort   bool `json:"storm_short,omitempty"`
	// NoOwner is how long partitions waited with no member running their
	// worker, from the moment one stopped to the moment the next started
	// (see owners).
	NoOwner *NoOwner `json:"no_owner,omitempty"`
	// StaticMoved (with -instance-id) is how many of a restarted static
	// member's partitions another member ran before the restart took
	// them back, summed over the run's restarts.
	StaticMoved *int `json:"static_moved,omitempty"`
	// RestartRecoveryMs (replay): from the group's restart after the
	// rewind until the records it consumes per second are back to 90 % of
	// their rate before the stop (restartRecovery); 0 when not before
	// the stream ended.
	RestartRecoveryMs float64 `json:"restart_recovery_ms,omitempty"`
	// With -spans: span durations by name, the CPU split, and
	// Postgres' statistics of the run's tables and WAL.
	SpanStats []SpanStat `json:"span_stats,omitempty"`
	CPU       *CPUSplit  `json:"cpu,omitempty"`
	PGTables  []PGTable  `json:"pg_tables,omitempty"`
	WAL       *WAL       `json:"wal,omitempty"`
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
	// Took is how long the change took to return, in seconds: a leave
	// drains the member's in-flight batches, a crash waits for the member
	// to stop and its replacement to start.
	Took float64 `json:"took,omitempty"`
	// RecoveryMs is the time until the rate recovered (see recovery); 0
	// when it did not before the stream ended.
	RecoveryMs float64 `json:"recovery_ms,omitempty"`
	// Held and Moved (a static member's restart): the partitions the
	// member ran when it was killed, and how many of them another member
	// ran before the restart took them back.
	Held  int  `json:"held,omitempty"`
	Moved *int `json:"moved,omitempty"`
}

type bench struct {
	o   options
	log *slog.Logger
	// With -spans: the recorder of every span the members end, the
	// TracerProvider that feeds it, and the pools' pgx tracer over it.
	spans    *spanRecorder
	tp       trace.TracerProvider
	pgTracer pgx.QueryTracer
	prof     *profile // the running run's, for drive (runs are one at a time)
	// noCheckpoint: CHECKPOINT was refused once (said then); runs start
	// wherever the server's checkpoint cycle is.
	noCheckpoint bool
	formats      *formats // -format: how the scenarios' records are encoded and read
	// protocol is the group protocol of the scenarios running now (one of
	// -group-protocol's), and steadyRate each protocol's latest steady
	// rate, which sizes its storm's backlog.
	protocol   string
	steadyRate map[string]float64
	own        *owners // the running scenario's members' partitions
	// static: the running scenario's members have instance ids
	// (-instance-id, the storm only: a replay's rewind needs the group
	// empty, which static members leave only when their sessions end).
	static bool
}

// env is one run's topic, group and schema.
type env struct {
	brokers []string
	topic   string
	group   string
	schema  string
	app     string // the pool's application_name
	pool    *pgxpool.Pool
	// probe is the harness's own connection, for what it reads while a
	// run goes (the records committed): on the members' pool, each read
	// would wait for a connection behind their batches, and take one.
	probe *pgxpool.Pool
	ends  map[int32]int64 // the offset after each partition's last preloaded record
	close func()
}

func (b *bench) newEnv(ctx context.Context, name string) (*env, error) {
	var r [3]byte
	_, _ = rand.Read(r[:])
	suffix := strings.ReplaceAll(name, "-", "_") + "_" + hex.EncodeToString(r[:])
	e := &env{topic: "bench-" + suffix, group: "bench-" + suffix, schema: "bench_" + suffix, ends: map[int32]int64{}}
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
	e.app = "onceflow-" + e.schema
	pc.ConnConfig.RuntimeParams["application_name"] = e.app
	if b.pgTracer != nil {
		pc.ConnConfig.Tracer = b.pgTracer
	}
	e.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() {
		_, _ = e.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{e.schema}.Sanitize()+` CASCADE`)
		e.pool.Close()
	})
	probe := pc.Copy()
	probe.MaxConns = 1
	probe.ConnConfig.Tracer = nil
	probe.ConnConfig.RuntimeParams["application_name"] = e.app + "-harness"
	if e.probe, err = pgxpool.NewWithConfig(ctx, probe); err != nil {
		e.close()
		return nil, err
	}
	closers = append(closers, e.probe.Close)
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
			kfake.GroupMinSessionTimeout(100*time.Millisecond),
			// Under -group-protocol consumer the broker sets the session
			// and the heartbeat: members.Tuned's, as under classic. (A
			// real Kafka's are its own: 45s and 5s by default.)
			kfake.BrokerConfigs(map[string]string{
				"group.consumer.session.timeout.ms":    "3000",
				"group.consumer.heartbeat.interval.ms": "300",
			}))
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
		for _, r := range recs {
			e.ends[r.Partition] = max(e.ends[r.Partition], r.Offset+1)
		}
	}
	return nil
}

// stored reads the group's offsets stored in Postgres, in one query:
// committed is how many records have a committed batch (the sum of the
// next offsets, as members.Committed counts them), and firstDone whether
// some partition with records has its next offset at its end.
func (e *env) stored(ctx context.Context) (committed int64, firstDone bool, err error) {
	rows, err := e.probe.Query(ctx, `SELECT partition, next_offset FROM `+pgx.Identifier{e.schema, "sink_offsets"}.Sanitize()+
		` WHERE consumer_group = $1 AND next_offset IS NOT NULL`, e.group)
	if err != nil {
		return 0, false, fmt.Errorf("read the offsets stored for group %s: %w", e.group, err)
	}
	var p int32
	var next int64
	_, err = pgx.ForEachRow(rows, []any{&p, &next}, func() error {
		committed += next
		if end := e.ends[p]; end > 0 && next >= end {
			firstDone = true
		}
		return nil
	})
	return committed, firstDone, err
}

// group is the members of one run's consumer group, with every batch's
// duration and when the last one ended.
type group struct {
	*members.Group
	mu   sync.Mutex
	dur  []time.Duration
	last time.Time // when the latest batch committed
}

// newGroup returns the members of e's group; tune, if set, adjusts each
// member's consumer config.
func (b *bench) newGroup(e *env, tune func(*processor.Config)) (*group, error) {
	hs, err := orders.Handlers(e.schema, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	g := &group{}
	cfg := members.Tuned(processor.Config{
		Brokers: e.brokers, Topics: []string{e.topic}, Group: e.group,
		BatchMaxRecords: b.o.batch, BatchLinger: 20 * time.Millisecond, Logger: b.log, Decode: b.formats.decode(),
		OnBatch: func(bi processor.BatchInfo) {
			g.mu.Lock()
			if !bi.Result.OffsetDeferred { // batch latency: to a COMMIT
				g.dur = append(g.dur, bi.Duration)
			}
			g.last = time.Now()
			g.mu.Unlock()
		},
	})
	cfg.GroupProtocol = processor.GroupProtocol(cmp.Or(b.protocol, string(processor.DefaultGroupProtocol)))
	if b.static {
		cfg.InstanceID = "bench" // bench-member-N
	}
	if tune != nil {
		tune(&cfg)
	}
	cfg.TracerProvider = b.tp
	own := b.own
	var starting string // the name of the member starting: Group.Start starts one at a time
	start := members.InProcess(members.InProcessConfig{Pool: e.pool, Consumer: cfg, LRUSize: 100000, Kill: b.o.crash == "kill",
		Writer: sink.Config{Schema: e.schema, Group: e.group, Handlers: hs, Parse: orders.ParseEvent, Logger: b.log, TracerProvider: b.tp},
		Started: func(c *processor.Consumer, _ *dedup.Cache) {
			if own != nil {
				own.add(starting, c)
			}
		}})
	g.Group = members.NewGroup(func(ctx context.Context, name string) (members.Member, error) {
		starting = name
		return start(ctx, name)
	})
	return g, nil
}

// startN starts n members.
func (g *group) startN(ctx context.Context, n int) error {
	for range n {
		if _, err := g.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// scenario runs one of steady, storm and replay.
func (b *bench) scenario(ctx context.Context, name string) (*Run, error) {
	events := b.o.events
	if name == "storm" {
		events = b.stormEvents()
	}
	b.own, b.static = newOwners(), b.o.instanceID && name == "storm"
	defer func() { b.own, b.static = nil, false }()
	r, err := b.runGroup(ctx, runName(name, b.protocol, b.o.protocols), "scenario", events, nil, b.drive)
	if err == nil && name == "steady" {
		if b.steadyRate == nil {
			b.steadyRate = map[string]float64{}
		}
		b.steadyRate[b.protocol] = r.UniqueEventsPerSec
	}
	return r, err
}

// runGroup pre-loads a generated stream of events into a fresh env, runs
// -members members of a group (their consumer configs adjusted by tune)
// until drive returns, stops them and checks the tables. The members are
// stopped on every path before the env is dropped.
func (b *bench) runGroup(ctx context.Context, name, kind string, events int, tune func(*processor.Config),
	drive func(ctx context.Context, r *Run, g *group, e *env, start time.Time) error) (*Run, error) {
	stream, err := orders.Generate(events, b.o.duplicates, b.o.seed)
	if err != nil {
		return nil, err
	}
	e, err := b.newEnv(ctx, name)
	if err != nil {
		return nil, err
	}
	defer e.close()
	msgs, err := b.formats.encode(stream.Messages)
	if err != nil {
		return nil, err
	}
	progress("%s: pre-loading %d records (%d unique events, %s)", name, len(msgs), len(stream.Unique), b.formats.format)
	if err := e.preload(ctx, msgs); err != nil {
		return nil, err
	}
	msgs = nil
	r := &Run{Name: name, Kind: kind, Records: len(stream.Messages), UniqueEvents: len(stream.Unique)}
	if kind == "scenario" {
		r.Scenario, r.GroupProtocol = strings.TrimSuffix(name, "-"+b.protocol), cmp.Or(b.protocol, string(processor.DefaultGroupProtocol))
	}
	// The members run in this process, and the stream is a million orders
	// behind five million pointers: kept during the run, every collection
	// of the members' garbage would mark it again, which a member process
	// does not carry. It is generated again, the same, for the check.
	stream = orders.Stream{}
	runtime.GC()
	g, err := b.newGroup(e, tune)
	if err != nil {
		return nil, err
	}
	defer func() { _ = g.StopAll() }() // before e.close drops the schema
	prof, err := b.startProfile(ctx, e, kind == "scenario" && strings.TrimSuffix(name, "-"+b.protocol) == b.o.cpuprofOf)
	if err != nil {
		return nil, err
	}
	defer prof.stop() // on error paths; a no-op once done below
	b.prof = prof     // for drive's replay-reread profile
	defer func() { b.prof = nil }()
	resetPeakRSS()
	start := time.Now()
	if err := g.startN(ctx, b.o.members); err != nil {
		return nil, err
	}
	if err := drive(ctx, r, g, e, start); err != nil {
		return nil, err
	}
	if r.Seconds == 0 { // drive may have set it when the stream was done
		r.Seconds = time.Since(start).Seconds()
	}
	if err := g.StopAll(); err != nil {
		return nil, err
	}
	if err := prof.done(ctx, r); err != nil {
		return nil, err
	}
	r, err = b.finish(ctx, r, g, e, events)
	if err != nil || b.spans == nil {
		return r, err
	}
	if r.PGTables, err = tableStats(ctx, e.pool, e.schema); err != nil {
		return nil, err
	}
	return r, nil
}

// drive samples the run and changes its membership (storm) or rewinds it
// (replay) until every record is committed (twice over, for replay). It
// sets r.Seconds when the stream is done. A storm's changes run one at a
// time in a goroutine drive owns and waits for: sampling, and noticing the
// end of the stream, never wait for a member to leave (a leave drains the
// member's in-flight batches). A change due while another runs starts when
// that one returns.
func (b *bench) drive(ctx context.Context, r *Run, g *group, e *env, start time.Time) error {
	since := func() float64 { return time.Since(start).Seconds() }
	total := int64(r.Records)
	sample := time.NewTicker(250 * time.Millisecond)
	defer sample.Stop()
	var storm <-chan time.Time
	if r.Scenario == "storm" {
		r.StormPlanned = b.o.stormChanges
		t := time.NewTicker(b.o.stormEvery)
		defer t.Stop()
		storm = t.C
	}
	changed := make(chan changeResult, 1)
	changes, busy, due := 0, false, false
	if own := b.own; own != nil {
		stopWatch := own.watch(start)
		defer func() { r.NoOwner = stopWatch() }()
	}
	startChange := func() {
		changes++
		busy, due = true, false
		n, at := changes, since()
		go func() {
			m, err := stormChange(ctx, g, n, at, b.static, b.own)
			changed <- changeResult{m, err}
		}()
	}
	// finish waits for the change in flight, if any, and orders the marks.
	finish := func(err error) error {
		if busy {
			c := <-changed
			busy = false
			r.Marks = append(r.Marks, c.mark)
			err = errors.Join(err, c.err)
		}
		slices.SortStableFunc(r.Marks, func(a, b Mark) int { return cmp.Compare(a.T, b.T) })
		return err
	}
	reset, reread := false, r.Scenario == "replay" && b.o.cpuprofOf == "replay-reread"
	var rereadTo int64 // the records committed when the rewind came
	lastLog := time.Now()
	for {
		select {
		case <-ctx.Done():
			return finish(ctx.Err())
		case <-storm:
			if changes >= b.o.stormChanges {
				storm = nil // the storm is over
				continue
			}
			if busy {
				due = true
				continue
			}
			startChange()
		case c := <-changed:
			busy = false
			r.Marks = append(r.Marks, c.mark)
			if c.err != nil {
				return finish(c.err)
			}
			if due && changes < b.o.stormChanges {
				startChange()
			}
		case <-sample.C:
			s := g.Stats()
			r.Samples = append(r.Samples, Sample{since(), s.Applied, s.RecordsConsumed, s.SkippedLRU, s.SkippedPostgres})
			done, first, err := e.stored(ctx)
			if err != nil {
				return finish(err)
			}
			if first && r.Scenario != "replay" && r.FirstDoneSeconds == 0 {
				r.FirstDoneSeconds = since()
				r.FirstDoneEventsPerSec = float64(s.Applied) / float64(len(b.o.handlers)) / r.FirstDoneSeconds
			}
			if time.Since(lastLog) > 2*time.Second {
				progress("%s: %5.1fs committed %d/%d records, applied %d, skipped lru %d postgres %d",
					r.Name, since(), done, total, s.Applied, s.SkippedLRU, s.SkippedPostgres)
				lastLog = time.Now()
			}
			if r.Scenario == "replay" && !reset && done >= total/2 {
				reset = true
				at := since()
				if err := b.rewind(ctx, g, e); err != nil {
					return err
				}
				// The stop is part of what recovers; Took is the stop,
				// the rewind and the start.
				r.Marks = append(r.Marks, Mark{T: at, Kind: "reset", Took: since() - at})
				if reread {
					rereadTo = done
					if err := b.prof.startCPU(); err != nil {
						return err
					}
				}
				continue
			}
			if reread && reset && done >= rereadTo && b.prof.cpuFile != nil {
				if err := b.prof.stop(); err != nil { // the applied half is read again
					return err
				}
			}
			if done >= total && (r.Scenario != "replay" || reset) {
				if r.Scenario == "storm" && (changes < b.o.stormChanges || busy) {
					// The stream ran out before the storm: its rate is
					// not a storm's (see stormEvents). Said in results.
					r.StormShort = true
				}
				// The stream ended when its last batch committed, not at
				// this sample, up to 250 ms later (the baselines time
				// their own end).
				r.Seconds = since()
				g.mu.Lock()
				if g.last.After(start) {
					r.Seconds = min(r.Seconds, g.last.Sub(start).Seconds())
				}
				g.mu.Unlock()
				return finish(nil)
			}
		}
	}
}

// changeResult is what one storm change returns to drive.
type changeResult struct {
	mark Mark
	err  error
}

// stormChange is the storm's n-th membership change, begun at (seconds
// since the start): a member joins, the oldest leaves, or (every third
// change, members.CrashTurn) the oldest crashes and a replacement joins.
// Its mark records how long the change took.
func stormChange(ctx context.Context, g *group, n int, at float64, static bool, own *owners) (Mark, error) {
	t := time.Now()
	var kind string
	var err error
	switch {
	case members.CrashTurn(n) && static:
		// A static member's crash and restart under its instance id: its
		// partitions should move to no one else.
		kind = "restart"
		var m members.Member
		if m, err = g.Restart(ctx); err == nil && m != nil && own != nil {
			held := own.lastHeld(m.Name())
			moved, ok := own.retaken(ctx, m.Name(), held, t, 30*time.Second)
			mark := Mark{T: at, Kind: kind, Took: time.Since(t).Seconds(), Held: len(held)}
			if ok {
				mark.Moved = &moved
			}
			return mark, nil
		}
	case members.CrashTurn(n):
		kind = "crash"
		if _, err = g.Crash(); err == nil {
			_, err = g.Start(ctx)
		}
	case n%3 == 1:
		kind = "join"
		_, err = g.Start(ctx)
	default:
		kind = "leave"
		_, err = g.Leave()
	}
	return Mark{T: at, Kind: kind, Took: time.Since(t).Seconds()}, err
}

// rewind stops the group, moves its Kafka and Postgres offsets back to the
// start of every partition, and starts it again: every record is read once
// more, and dedup must apply none of them twice.
func (b *bench) rewind(ctx context.Context, g *group, e *env) error {
	n := g.Counts().Running
	if err := g.StopAll(); err != nil {
		return err
	}
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
	return g.startN(ctx, n)
}

// finish completes r from the group's counters and checks the tables
// against the stream of events unique events, generated again.
func (b *bench) finish(ctx context.Context, r *Run, g *group, e *env, events int) (*Run, error) {
	s := g.Stats()
	r.RecordsConsumed, r.RecordsFetched, r.SkippedLRU, r.SkippedPostgres = s.RecordsConsumed, s.RecordsFetched, s.SkippedLRU, s.SkippedPostgres
	r.UniqueEventsPerSec = float64(r.UniqueEvents) / r.Seconds
	r.RecordsPerSec = float64(r.RecordsConsumed) / r.Seconds
	g.mu.Lock()
	r.BatchP50Ms, r.BatchP99Ms = percentileMs(g.dur, 0.50), percentileMs(g.dur, 0.99)
	g.mu.Unlock()
	r.Changes = len(r.Marks)
	r.RecoveryMedianMs, r.RecoveryMaxMs = recovery(r)
	if r.Scenario == "replay" {
		for _, m := range r.Marks {
			if m.Kind == "reset" {
				r.RestartRecoveryMs = restartRecovery(r.Samples, m)
			}
		}
	}
	if b.o.instanceID && r.Scenario == "storm" {
		moved := 0
		for _, m := range r.Marks {
			if m.Moved != nil {
				moved += *m.Moved
			}
		}
		r.StaticMoved = &moved
	}
	r.PeakRSSMiB = peakRSSMiB()
	stream, err := orders.Generate(events, b.o.duplicates, b.o.seed)
	if err != nil {
		return nil, err
	}
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

// recoveryShare is the share of the rate before a membership change that
// counts as recovered.
const recoveryShare = 0.9

// recoveryWindow is the span, in seconds, over which the rate after a
// change is measured; the window lies wholly after the change, so it is
// also the shortest recovery that can be measured.
const recoveryWindow = 0.5

// recovery measures, for each mark, the time until the applied rate over
// the last recoveryWindow is back to recoveryShare of the rate of the two seconds
// before the mark. A mark after which the rate never gets back (the end
// of the stream came first) is left out.
func recovery(r *Run) (median, maxMs float64) {
	// rate is the applied rate over the samples in (t-d, t] ending at i.
	rate := func(i int, d float64) (float64, bool) {
		j := i
		for j > 0 && r.Samples[j-1].T > r.Samples[i].T-d {
			j--
		}
		if j == 0 || r.Samples[i].T-r.Samples[j-1].T < d/2 {
			return 0, false
		}
		dt := r.Samples[i].T - r.Samples[j-1].T
		return float64(r.Samples[i].Applied-r.Samples[j-1].Applied) / dt, true
	}
	var rs []float64
	for mi := range r.Marks {
		m := &r.Marks[mi]
		last, after := -1, -1
		for i, s := range r.Samples {
			if s.T <= m.T {
				last = i
			} else if after < 0 {
				after = i
			}
		}
		if last < 0 || after < 0 {
			continue
		}
		before, ok := rate(last, 2)
		if !ok || before == 0 {
			continue
		}
		for i := after; i < len(r.Samples); i++ {
			if v, ok := rate(i, recoveryWindow); ok && r.Samples[i].T-recoveryWindow >= m.T && v >= recoveryShare*before {
				m.RecoveryMs = (r.Samples[i].T - m.T) * 1000
				rs = append(rs, m.RecoveryMs)
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

// restartRecovery is the time, in ms, from the group's start after a
// replay's rewind (the reset mark's T plus Took) until the records it
// consumes per second, over the last recoveryWindow, are back at
// recoveryShare of their rate over the 2 s before the stop; 0 when they
// never are before the stream ends. Records, not applied events: after
// the rewind the group re-reads what it had applied, which applies
// nothing and is the replay's work at full speed.
func restartRecovery(ss []Sample, reset Mark) float64 {
	stop, restart := reset.T, reset.T+reset.Took
	var before float64
	for i := len(ss) - 1; i > 0; i-- {
		if ss[i].T <= stop {
			j := i
			for j > 0 && ss[j-1].T >= stop-2 {
				j--
			}
			if dt := ss[i].T - ss[j].T; j < i && dt > 0 {
				before = float64(ss[i].Consumed-ss[j].Consumed) / dt
			}
			break
		}
	}
	if before <= 0 {
		return 0
	}
	for i := 1; i < len(ss); i++ {
		if ss[i].T-recoveryWindow < restart {
			continue
		}
		j := i
		for j > 0 && ss[j-1].T >= ss[i].T-recoveryWindow {
			j--
		}
		if dt := ss[i].T - ss[j].T; j < i && dt > 0 && float64(ss[i].Consumed-ss[j].Consumed)/dt >= recoveryShare*before {
			return (ss[i].T - restart) * 1000
		}
	}
	return 0
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
