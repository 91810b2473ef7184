package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/processor"
)

// RunResult is one measured run: a scenario or a baseline, one round.
type RunResult struct {
	// Name is the scenario's or the baseline's, suffixed with the group
	// protocol when Config.GroupProtocols has several (steady-consumer).
	Name  string `json:"name"`
	Round int    `json:"round"`
	// Schema holds onceflow's tables and the Go handlers'; TablesSchema
	// the clones of the user's tables and sequences: Schema + "_t".
	Schema       string `json:"schema"`
	TablesSchema string `json:"tables_schema"`
	// Scenario and GroupProtocol: a scenario run's scenario (steady,
	// storm, replay) and its members' group protocol.
	Scenario      string `json:"scenario,omitempty"`
	GroupProtocol string `json:"group_protocol,omitempty"`
	// Writers: a baseline's writers at once (Settings.BaselineWriters).
	Writers int    `json:"writers,omitempty"`
	Format  string `json:"format,omitempty"` // a scenario run's payload format, when not JSON (Config.Formats)
	// Events are the unique events applied; Records the records read
	// (with the redeliveries, and for replay the half read twice).
	Events       int     `json:"events"`
	Records      int     `json:"records"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// ExactlyOnce: every unique event claimed once per handler, no dead
	// letter, the written tables as effects-only left them. Problems
	// says what was not.
	ExactlyOnce bool                  `json:"exactly_once"`
	Problems    []string              `json:"problems,omitempty"`
	Tables      map[string]TableState `json:"tables,omitempty"`
	// TableChecks says how each table passed the comparison with
	// effects-only (CheckDigest, CheckSums); a table that failed it is
	// in Problems instead.
	TableChecks map[string]string `json:"table_checks,omitempty"`
	Series      []Sample          `json:"series,omitempty"`
	Changes     []Change          `json:"changes,omitempty"`
	// Consumer is the members' counters summed (scenarios only): where
	// a run's time goes starts with its batches' sizes and its skips.
	Consumer *ConsumerStats `json:"consumer,omitempty"`
	// BatchP50Ms and BatchP99Ms (scenarios): the latency of the members'
	// committed batches, from a batch closing to its COMMIT, retries
	// included (processor.BatchInfo.Duration).
	BatchP50Ms float64 `json:"batch_p50_ms,omitempty"`
	BatchP99Ms float64 `json:"batch_p99_ms,omitempty"`
	// PeakRSSMiB is this process's peak resident set during the run
	// (VmHWM, reset at its start; Linux only): the members and the
	// baselines' writers, and the generated stream the benchmark holds.
	PeakRSSMiB float64 `json:"peak_rss_mib,omitempty"`
	// FromCheckpoint: the run began right after a CHECKPOINT
	// (Config.Checkpoint, and the role may); Checkpoints is how many the
	// server began during the run.
	FromCheckpoint bool   `json:"from_checkpoint"`
	Checkpoints    *int64 `json:"checkpoints,omitempty"`
	// RecoveryMedianMs and RecoveryMaxMs (storm): over the changes
	// measured, RecoveryMeasured of them, the time until the applied
	// rate, over half a second, is back to 90 % of its rate before the
	// change (Change.RecoveryMs: the greater of the rate over the two
	// seconds before and the run's median rate up to the change). A
	// change with no rate before it (nothing applied for half a second
	// yet) or after which the stream ended first is not measured; with
	// none measured both are 0 and mean nothing.
	RecoveryMedianMs float64 `json:"recovery_median_ms,omitempty"`
	RecoveryMaxMs    float64 `json:"recovery_max_ms,omitempty"`
	RecoveryMeasured int     `json:"recovery_measured,omitempty"`
	// BackAtRateMs (replay): from the second group's start until its
	// records rate (committed, over half a second) is back at 90 % of the
	// first group's over its last two seconds; nil when the first group
	// read for under two seconds or the stream ended first.
	BackAtRateMs *float64 `json:"back_at_rate_ms,omitempty"`
	// StormPlanned is the storm's planned changes (Config.StormChanges);
	// StormShort says the stream was consumed before the last of them:
	// the run's rate is not a whole storm's.
	StormPlanned int  `json:"storm_planned_changes,omitempty"`
	StormShort   bool `json:"storm_short,omitempty"`
	// NoOwner (scenarios) is how long partitions waited with no member
	// running their worker: from a worker stopping on one member to one
	// starting on any member, polled every 20 ms. A replay's include its
	// stop and the second group's start.
	NoOwner *NoOwner `json:"no_owner,omitempty"`
	// StaticMoved (storm, Config.InstanceID): how many of the restarted
	// static members' partitions another member ran before the restart
	// took them back, summed over the restarts, of StaticHeld.
	StaticMoved *int `json:"static_moved,omitempty"`
	StaticHeld  int  `json:"static_held,omitempty"`
}

// ConsumerStats are a scenario run's members' counters, summed.
type ConsumerStats struct {
	RecordsConsumed int64   `json:"records_consumed"`
	Batches         int64   `json:"batches"`
	MeanBatch       float64 `json:"mean_batch_records"`
	Applied         int64   `json:"applied"` // (event, handler) pairs
	SkippedLRU      int64   `json:"skipped_lru"`
	SkippedPostgres int64   `json:"skipped_postgres"`
}

func consumerStats(s processor.Stats) *ConsumerStats {
	c := &ConsumerStats{RecordsConsumed: s.RecordsConsumed, Batches: s.Batches, Applied: s.Applied,
		SkippedLRU: s.SkippedLRU, SkippedPostgres: s.SkippedPostgres}
	if s.Batches > 0 {
		c.MeanBatch = float64(s.RecordsConsumed) / float64(s.Batches)
	}
	return c
}

// Results are a benchmark's runs and its summary.
type Results struct {
	Started  time.Time   `json:"started"`
	Settings Settings    `json:"settings"`
	Runs     []RunResult `json:"runs"`
	// Summary has one line per scenario and baseline: the median run's
	// rate and its ratios to the baselines.
	Summary []Line `json:"summary"`
	// Price is 1 − steady/effects-only (a share; NaN-free: 0 when either
	// is missing, with HasPrice false).
	Price    float64 `json:"price_of_exactly_once"`
	HasPrice bool    `json:"has_price"`
	// PriceByProtocol, with several group protocols, is each one's price
	// (its steady run against effects-only); Price is the first's.
	PriceByProtocol map[string]float64 `json:"price_by_protocol,omitempty"`
	// Protocols compares the group protocols the scenarios ran under,
	// when there were several or with Config.InstanceID.
	Protocols []ProtocolSummary `json:"protocols,omitempty"`
	// Formats compares each scenario in each of Config.Formats with its
	// JSON runs (the summary's medians).
	Formats []FormatRatio `json:"formats,omitempty"`
	// Schemas are the schemas the runs made, in order, a run that did
	// not finish included: left in the database with Config.Keep, which
	// also keeps the run's marker (<Schema>_<id>_run, first; see
	// FindLeftovers).
	Schemas []string `json:"-"`
}

// Settings are what a run measured, for the report and for comparing.
type Settings struct {
	Topic      string   `json:"topic"`
	Payloads   string   `json:"payloads"`
	Handlers   []string `json:"handlers"`
	Tables     []string `json:"tables"`
	Events     int      `json:"events"`
	Records    int      `json:"records"`
	Duplicates float64  `json:"duplicates"`
	// OtherPartition is the share of the redeliveries on another
	// partition than their event's first delivery (nil in results of
	// builds before it was said).
	OtherPartition *float64 `json:"other_partition,omitempty"`
	Partitions     int      `json:"partitions"`
	Members        int      `json:"members"`
	Rounds         int      `json:"rounds"`
	BatchMax       int      `json:"batch_max_records"`
	PoolSize       int      `json:"pool_size"`
	// BaselineWriters are the writers of each baseline (by its name);
	// Calibration, when they were measured, each candidate's rate.
	BaselineWriters map[string]int `json:"baseline_writers,omitempty"`
	Calibration     []Calibration  `json:"calibration,omitempty"`
	// BaselineWritersBy: "measured", "set" (Config.BaselineWriters), or
	// why they were not timed ("untimed: …": the pool's connections).
	BaselineWritersBy string `json:"baseline_writers_by,omitempty"`
	Kafka             string `json:"kafka"` // "embedded kfake" or the brokers
	// StormChanges and StormEvery: the storm's planned membership
	// changes and the time between them (seconds).
	StormChanges   int      `json:"storm_changes,omitempty"`
	StormEvery     float64  `json:"storm_every_s,omitempty"`
	GroupProtocols []string `json:"group_protocols,omitempty"`
	Formats        []string `json:"formats,omitempty"` // besides JSON
	InstanceID     bool     `json:"instance_id,omitempty"`
	Checkpoint     bool     `json:"checkpoint,omitempty"`
	// Build is the onceflow module's version and VCS revision, as the
	// binary was built (debug.ReadBuildInfo), "" when unknown.
	Build string `json:"build,omitempty"`
}

// Line is one scenario's or baseline's result.
type Line struct {
	Name         string    `json:"name"`
	EventsPerSec float64   `json:"events_per_sec"` // the median run's
	Rounds       []float64 `json:"rounds"`         // every round's
	VsEffects    float64   `json:"vs_effects_only,omitempty"`
	VsRawCopy    float64   `json:"vs_raw_copy,omitempty"`
	ExactlyOnce  bool      `json:"exactly_once"`
}

// benchRun is one call of Run's state.
type benchRun struct {
	cfg   Config
	iso   *Isolation
	kafka *kafkaTopic
	recs  *streamRecords
	line  *progressLine
	names []string // the handlers'
	id    string   // in the groups' and schemas' names: never reused, on any cluster or database
	ref   map[string]TableState
	mu    sync.Mutex
	// noCheckpoint: CHECKPOINT was refused once (said then).
	noCheckpoint bool
	schemas      []string       // made by the runs, in order
	profiled     bool           // the CPU profile was taken
	formats      []*formatTopic // Config.Formats' streams
	writers      map[string]int // each baseline's writers (calibrate)
}

// Run benchmarks cfg's handlers (see the package doc): it generates the
// stream, isolates the handlers' tables (a *RefusedError when it cannot),
// produces the stream once, then runs, round by round, effects-only,
// raw-copy and the scenarios, each in a new schema, and checks each run
// from its tables. A run that is not exactly once is reported in its
// Problems and makes Run's error non-nil (with the Results still
// returned). Schemas are dropped as each run ends unless Keep; the topic
// it created on Brokers is deleted. For its whole life Run holds an
// advisory lock on its id, on a connection of its own (one besides
// Pool's), and at its start it lists on Progress what earlier runs left
// that no running bench holds (FindLeftovers; DropLeftovers drops it).
// Run returns once everything it started has stopped.
func Run(ctx context.Context, cfg Config) (res *Results, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The run's lock and its marker schema before anything else of its
	// own exists (see runLock): a later run tells what a killed one left.
	lock, err := lockRun(ctx, cfg.Pool)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, lock.release(context.WithoutCancel(ctx))) }()
	b := &benchRun{cfg: cfg, line: newProgressLine(cfg.Progress), id: lock.id}
	marker := pgx.Identifier{markerSchema(cfg.Schema, b.id)}.Sanitize()
	if _, err := cfg.Pool.Exec(ctx, "CREATE SCHEMA "+marker); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", marker, err)
	}
	if cfg.Keep {
		b.schemas = append(b.schemas, markerSchema(cfg.Schema, b.id))
	}
	defer func() {
		if cfg.Keep { // the kept schemas' run, which FindLeftovers can tell is over
			return
		}
		if _, derr := cfg.Pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+marker); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop schema %s: %w", marker, derr))
		}
	}()
	left, err := FindLeftovers(ctx, cfg, b.id, cfg.DropLeftovers)
	if err != nil {
		return nil, err
	}
	if r := left.Report(cfg.DropLeftovers); r != "" {
		fmt.Fprint(cfg.Progress, "onceflow bench: "+r)
	}
	res = &Results{Started: time.Now().UTC()}
	defer func() {
		if res != nil {
			b.mu.Lock()
			res.Schemas = slices.Clone(b.schemas)
			b.mu.Unlock()
		}
	}()
	hs, err := cfg.Handlers(cfg.Schema + "_probe")
	if err != nil {
		return nil, err
	}
	if len(hs) == 0 {
		return nil, errors.New("bench: no handler consumes the topic")
	}
	for _, h := range hs {
		b.names = append(b.names, h.Name())
	}
	if b.iso, err = Isolate(ctx, cfg.Pool, hs, cfg.Migrate); err != nil {
		return nil, err
	}
	s, err := Generate(cfg.Payloads, GenerateConfig{Events: cfg.Events, Duplicates: cfg.Duplicates, Partitions: cfg.Partitions,
		OtherPartition: cfg.OtherPartition, Seed: cfg.Seed})
	if err != nil {
		return nil, err
	}
	if b.kafka, err = openKafka(ctx, cfg, b.id); err != nil {
		return nil, err
	}
	defer func() {
		if cerr := b.kafka.close(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	// The events are Topic's, whatever the topic the records are produced
	// to (produce sets it): the baselines' handlers see Topic, as the
	// members' do (topicAs).
	if b.recs, err = records(s, cfg.Topic, cfg.Consumer.Decode); err != nil {
		return nil, err
	}
	if err := b.iso.probe(ctx, b.recs.events); err != nil {
		return nil, err
	}
	kafka := "embedded kfake"
	if len(cfg.Brokers) > 0 {
		kafka = fmt.Sprint(cfg.Brokers)
	}
	res.Settings = Settings{Topic: b.kafka.topic, Payloads: cfg.Payloads.String(), Handlers: b.names, Events: len(s.Events), Records: len(s.Records),
		Duplicates: cfg.Duplicates, Partitions: cfg.Partitions, Members: cfg.Members, Rounds: cfg.Rounds,
		BatchMax: b.batch(), PoolSize: cfg.PoolSize, Kafka: kafka, InstanceID: cfg.InstanceID, Checkpoint: cfg.Checkpoint, Build: build()}
	if slices.Contains(cfg.Scenarios, Storm) {
		res.Settings.StormChanges, res.Settings.StormEvery = cfg.StormChanges, cfg.StormEvery.Seconds()
	}
	res.Settings.OtherPartition = new(sharePlaced(cfg.Duplicates, cfg.Partitions, cfg.OtherPartition)) // the share that applied
	for _, p := range cfg.GroupProtocols {
		res.Settings.GroupProtocols = append(res.Settings.GroupProtocols, string(p))
	}
	for _, t := range b.iso.Tables() {
		res.Settings.Tables = append(res.Settings.Tables, name(t))
	}
	seen := ""
	if b.kafka.topic != cfg.Topic {
		seen = ", which the handlers see as " + cfg.Topic
	}
	with := count(s.Redeliveries(), "redelivery", "redeliveries")
	if s.Redeliveries() > 0 {
		with += ", " + where(res.Settings)
	}
	fmt.Fprintf(cfg.Progress, "onceflow bench: %s, %s with %s, on %s of %s (%s%s); handlers %v\n",
		count(len(s.Events), "unique event"), count(len(s.Records), "record"), with,
		count(cfg.Partitions, "partition"), b.kafka.topic, kafka, seen, b.names)
	if len(res.Settings.Tables) > 0 {
		fmt.Fprintf(cfg.Progress, "  your tables %v are cloned empty into schemas %s_*; they are not written\n", res.Settings.Tables, cfg.Schema)
	}
	t0 := time.Now()
	if err := b.kafka.produce(ctx, b.recs.recs); err != nil {
		return nil, err
	}
	b.recs.produced()
	fmt.Fprintf(cfg.Progress, "  produced %d records in %.1fs\n", len(b.recs.recs), time.Since(t0).Seconds())
	if len(cfg.Formats) > 0 {
		t0 = time.Now()
		b.formats, err = b.openFormats(ctx)
		defer func() {
			for _, f := range b.formats {
				err = errors.Join(err, f.k.close(context.WithoutCancel(ctx)))
			}
		}()
		if err != nil {
			return nil, err
		}
		for _, f := range cfg.Formats {
			res.Settings.Formats = append(res.Settings.Formats, string(f.Name))
		}
		fmt.Fprintf(cfg.Progress, "  produced them again in %v in %.1fs\n", res.Settings.Formats, time.Since(t0).Seconds())
	}

	if err := b.calibrate(ctx, res); err != nil {
		return res, err
	}
	var failed []string
	for round := 1; round <= cfg.Rounds; round++ {
		specs := []runSpec{{name: EffectsOnly, scenario: EffectsOnly}} // always: the tables' reference
		if !cfg.NoRawCopy {
			specs = append(specs, runSpec{name: RawCopy, scenario: RawCopy})
		}
		for _, p := range cfg.GroupProtocols {
			for _, sc := range cfg.Scenarios {
				specs = append(specs, runSpec{name: runName(sc, p, cfg.GroupProtocols), scenario: sc, protocol: p})
			}
		}
		for _, f := range b.formats {
			for _, sc := range cfg.Scenarios {
				specs = append(specs, runSpec{name: sc + "-" + string(f.f.Name), scenario: sc, protocol: cfg.GroupProtocols[0], format: f})
			}
		}
		for _, sp := range specs {
			r, err := b.run(ctx, sp, round)
			if err != nil {
				return res, err
			}
			res.Runs = append(res.Runs, *r)
			if !r.ExactlyOnce {
				failed = append(failed, fmt.Sprintf("%s round %d: %v", sp.name, round, r.Problems))
			}
		}
	}
	summarize(res, runName(Steady, cfg.GroupProtocols[0], cfg.GroupProtocols))
	if len(cfg.GroupProtocols) > 1 || cfg.InstanceID {
		res.Protocols = summarizeProtocols(res, cfg.GroupProtocols)
	}
	if len(cfg.Formats) > 0 {
		res.Formats = formatRatios(res, cfg.Scenarios, cfg.Formats)
	}
	if len(failed) > 0 {
		return res, fmt.Errorf("bench: not exactly once:\n  %s", joinLines(failed))
	}
	return res, nil
}

// runSpec is one run to make: a baseline, or a scenario under a group
// protocol.
type runSpec struct {
	name     string // the run's: the scenario's, suffixed with the protocol when there are several
	scenario string // or the baseline's name
	protocol processor.GroupProtocol
	format   *formatTopic // nil: JSON, the stream of b.kafka
}

// runName is scenario's run under protocol: the scenario's name alone
// when the benchmark runs one protocol, suffixed with it when several.
func runName(scenario string, protocol processor.GroupProtocol, protocols []processor.GroupProtocol) string {
	if len(protocols) < 2 {
		return scenario
	}
	return scenario + "-" + string(protocol)
}

// run runs one scenario or baseline in a schema of its own: after a
// CHECKPOINT with Config.Checkpoint, with this process's peak RSS reset,
// under the CPU profile when it is the one Config.CPUProfileOf names.
func (b *benchRun) run(ctx context.Context, spec runSpec, round int) (_ *RunResult, err error) {
	n := spec.name
	// The id keeps two benchmarks on one database, at once or one after
	// a --keep, apart; Create fails on a schema that exists.
	schema := fmt.Sprintf("%s_%s_%s_r%d", b.cfg.Schema, b.id, schemaWord(n), round)
	pool, err := b.iso.Create(ctx, schema, b.cfg.PoolSize)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.schemas = append(b.schemas, schema, cloneSchema(schema))
	b.mu.Unlock()
	defer pool.Close()
	defer func() {
		if !b.cfg.Keep {
			err = errors.Join(err, b.iso.Drop(context.WithoutCancel(ctx), schema))
		}
	}()
	r := &RunResult{Name: n, Round: round, Schema: schema, TablesSchema: cloneSchema(schema), Events: len(b.recs.events), Records: len(b.recs.recs)}
	if spec.protocol != "" {
		r.Scenario, r.GroupProtocol = spec.scenario, string(spec.protocol)
	}
	kafka, format := b.kafka, (*Format)(nil)
	if spec.format != nil {
		kafka, format = spec.format.k, &spec.format.f
		r.Format = string(format.Name)
	}
	label := fmt.Sprintf("%s (round %d)", n, round)
	cps, err := b.fromCheckpoint(ctx, r)
	if err != nil {
		return nil, err
	}
	stopProfile := func() {}
	if b.cfg.CPUProfile != nil && !b.profiled && spec.scenario == b.cfg.CPUProfileOf {
		if err := pprof.StartCPUProfile(b.cfg.CPUProfile); err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		b.profiled = true
		stopProfile = sync.OnceFunc(pprof.StopCPUProfile)
		defer stopProfile()
	}
	resetPeakRSS()
	// A run lasts from its start (the members' start: their joining the
	// group included) to its last batch's COMMIT, or the baseline's last.
	start := time.Now()
	var stop time.Time
	switch spec.scenario {
	case EffectsOnly, RawCopy:
		hs, err := b.cfg.Handlers(schema)
		if err != nil {
			return nil, err
		}
		batch := b.batch()
		writers := b.writers[spec.scenario] // calibrate's, before the rounds
		r.Writers = writers
		b.line.set("  %s: %s, %d per transaction, %s", label, count(len(b.recs.events), "unique event"), batch, count(writers, "writer"))
		r.Records = len(b.recs.events)
		hs = guardHandlers(hs, b.iso.guard(schema), nil)
		if err := baseline(ctx, pool, schema, hs, b.recs.events, batch, writers, n == RawCopy, b.cfg.Writer.Parse); err != nil {
			b.failed(ctx, label)
			if we := (*WroteError)(nil); errors.As(err, &we) {
				return nil, fmt.Errorf("%s: %w", n, we)
			}
			var ee *eventError
			if errors.As(err, &ee) {
				return nil, fmt.Errorf("%s: the payload of %s does not apply: %s: %w (the baseline applies the payloads directly: they must apply without error)",
					n, b.cfg.Payloads.origin(ee.event), clip(ee.payload, 200), ee.err)
			}
			return nil, fmt.Errorf("%s: %w (the baseline applies the payloads directly: they must apply without error)", n, err)
		}
	case Steady, Storm:
		var st groupStats
		own := newOwners()
		stopWatch := own.watch()
		_, end, err := b.consume(ctx, &groupRun{pool: pool, schema: schema, group: fmt.Sprintf("onceflow-bench-%s-r%d-%s", schemaWord(n), round, b.id),
			protocol: spec.protocol, kafka: kafka, format: format, want: int64(len(b.recs.recs)), start: start, label: label, storm: spec.scenario == Storm,
			static: spec.scenario == Storm && b.cfg.InstanceID, r: r, st: &st, own: own})
		r.NoOwner = stopWatch()
		if err != nil {
			b.failed(ctx, label)
			return nil, err
		}
		stop = end
		b.groupResults(r, &st)
	case Replay:
		// Half-way (once half the records are committed: a little more
		// on a small run), the group stops; a group without stored
		// offsets then reads the topic from its start: what the first
		// read applied must apply nothing again.
		var st groupStats // both groups': the second applies nothing
		own := newOwners()
		stopWatch := own.watch()
		g := &groupRun{pool: pool, schema: schema, group: fmt.Sprintf("onceflow-bench-%s-r%d-%s-1", schemaWord(n), round, b.id),
			protocol: spec.protocol, kafka: kafka, format: format, want: int64(len(b.recs.recs) / 2), start: start, label: label + " first half", r: r, st: &st, own: own}
		half, _, err := b.consume(ctx, g)
		if err != nil {
			r.NoOwner = stopWatch()
			b.failed(ctx, label)
			return nil, err
		}
		r.Changes = append(r.Changes, Change{Seconds: time.Since(start).Seconds(), What: "reread"})
		g.group, g.want, g.label, g.prefix = strings.TrimSuffix(g.group, "-1")+"-2", int64(len(b.recs.recs)), label+" from the start", "reread/"
		_, end, err := b.consume(ctx, g)
		r.NoOwner = stopWatch()
		if err != nil {
			b.failed(ctx, label)
			return nil, err
		}
		r.Records = len(b.recs.recs) + int(half)
		stop = end
		b.groupResults(r, &st)
	}
	if stop.IsZero() {
		stop = time.Now()
	}
	stopProfile()
	if err := b.iso.unmoved(ctx, schema); err != nil {
		return nil, fmt.Errorf("%s: %w", n, err)
	}
	r.PeakRSSMiB = peakRSSMiB()
	if cps >= 0 {
		after, err := checkpoints(ctx, b.cfg.Pool)
		if err != nil {
			return nil, err
		}
		d := after - cps
		r.Checkpoints = &d
	}
	el := stop.Sub(start)

	r.Seconds = el.Seconds()
	r.EventsPerSec = float64(r.Events) / r.Seconds
	r.Tables = map[string]TableState{}
	for sch, ts := range b.iso.written(schema) {
		st, err := effects(ctx, pool, sch, ts)
		if err != nil {
			return nil, err
		}
		maps.Copy(r.Tables, st)
	}
	ref := b.ref
	if n == EffectsOnly && b.ref == nil {
		b.ref, ref = r.Tables, nil
	}
	if r.Problems, err = check(ctx, pool, schema, b.names, len(b.recs.events), n != EffectsOnly, r.Tables, ref); err != nil {
		return nil, err
	}
	r.ExactlyOnce = len(r.Problems) == 0
	verdict := "exactly once"
	if ref != nil {
		_, r.TableChecks = compareTables(r.Tables, ref)
		var by []string
		for _, t := range slices.Sorted(maps.Keys(r.TableChecks)) {
			by = append(by, t+" by "+r.TableChecks[t])
		}
		if len(by) > 0 {
			verdict += " (tables: " + strings.Join(by, ", ") + ")"
		}
	}
	if !r.ExactlyOnce {
		verdict = "NOT EXACTLY ONCE: " + joinLines(r.Problems)
	}
	extra := ""
	if r.StormShort {
		extra = fmt.Sprintf("; %d of %d changes made before the stream ended (raise --events)", len(r.Changes), r.StormPlanned)
	}
	if r.BackAtRateMs != nil {
		extra = fmt.Sprintf("; back at 90 %% of its records rate %.0f ms after the re-read's start", *r.BackAtRateMs)
	}
	b.line.done("  %s: %.0f events/s (%d events in %.1fs); %s%s", label, r.EventsPerSec, r.Events, r.Seconds, verdict, extra)
	return r, nil
}

// failed ends a run's progress: "interrupted" when ctx ended (a signal),
// else "failed".
func (b *benchRun) failed(ctx context.Context, label string) {
	if ctx.Err() != nil {
		b.line.done("  %s: interrupted", label)
		return
	}
	b.line.done("  %s: failed", label)
}

// clip is s, cut to n bytes with "…" when longer.
func clip(s []byte, n int) string {
	if len(s) <= n {
		return string(s)
	}
	return string(s[:n]) + "…"
}

// groupResults completes a scenario run from its groups' counters: the
// members' stats, the batches' latency, the storm's recoveries and, with
// static members, the partitions that moved.
func (b *benchRun) groupResults(r *RunResult, st *groupStats) {
	st.mu.Lock()
	r.Consumer = consumerStats(st.members)
	r.BatchP50Ms, r.BatchP99Ms = percentileMs(st.durs, 0.50), percentileMs(st.durs, 0.99)
	st.mu.Unlock()
	if r.Scenario == Replay && len(r.Changes) == 1 {
		c := &r.Changes[0]
		if ms, ok := backAtRate(r.Series, c.Seconds, committed, 0); ok {
			c.RecoveryMs, r.BackAtRateMs = ms, &ms
		}
	}
	if r.Scenario != Storm {
		return
	}
	r.RecoveryMedianMs, r.RecoveryMaxMs, r.RecoveryMeasured = recovery(r.Series, r.Changes)
	if !b.cfg.InstanceID {
		return
	}
	moved := 0
	for _, c := range r.Changes {
		if c.What == "restart" {
			r.StaticHeld += c.Held
			if c.Moved != nil {
				moved += *c.Moved
			}
		}
	}
	r.StaticMoved = &moved
}

// fromCheckpoint runs CHECKPOINT before a run when Config.Checkpoint
// asks and the role may (said once when it may not), and returns the
// checkpoints the server has begun, the benchmark's own counted, or -1
// when they cannot be read (the run then has no count).
func (b *benchRun) fromCheckpoint(ctx context.Context, r *RunResult) (int64, error) {
	before, err := checkpoints(ctx, b.cfg.Pool)
	if err != nil {
		fmt.Fprintf(b.cfg.Progress, "  the server's checkpoints cannot be counted (%v): runs give none\n", err)
		return -1, nil
	}
	ok, err := b.checkpoint(ctx)
	if err != nil || !ok {
		return before, err
	}
	r.FromCheckpoint = true
	return checkpointCounted(ctx, b.cfg.Pool, before)
}

// checkpoint runs CHECKPOINT when Config.Checkpoint asks and the role
// may (said once when it may not), and reports whether it ran.
func (b *benchRun) checkpoint(ctx context.Context) (bool, error) {
	if !b.cfg.Checkpoint || b.noCheckpoint {
		return false, nil
	}
	ok, err := checkpoint(ctx, b.cfg.Pool)
	if err != nil {
		return false, err
	}
	if !ok {
		b.noCheckpoint = true
		fmt.Fprintf(b.cfg.Progress, "  CHECKPOINT refused: the role needs pg_checkpoint (or superuser); runs start wherever the server's checkpoint cycle is (\"not from one\")\n")
	}
	return ok, nil
}

// schemaWord is a run's name as a schema name's part.
func schemaWord(n string) string {
	switch n {
	case EffectsOnly:
		return "effects_only"
	case RawCopy:
		return "raw_copy"
	}
	return strings.ReplaceAll(n, "-", "_")
}

func joinLines(ps []string) string {
	out := ""
	for i, p := range ps {
		if i > 0 {
			out += "; "
		}
		out += p
	}
	return out
}

// summarize fills res.Summary and the price from its runs: per name, the
// median round; of an even number, the lower of the middle two (a round
// that ran, whose details the report gives, and the less flattering).
// steady names the steady run the price is of (the first protocol's).
func summarize(res *Results, steady string) {
	var order []string
	by := map[string][]RunResult{}
	for _, r := range res.Runs {
		if _, ok := by[r.Name]; !ok {
			order = append(order, r.Name)
		}
		by[r.Name] = append(by[r.Name], r)
	}
	med := map[string]float64{}
	for _, n := range order {
		rs := by[n]
		l := Line{Name: n, ExactlyOnce: true}
		var rates []float64
		for _, r := range rs {
			l.Rounds = append(l.Rounds, r.EventsPerSec)
			rates = append(rates, r.EventsPerSec)
			l.ExactlyOnce = l.ExactlyOnce && r.ExactlyOnce
		}
		slices.Sort(rates)
		l.EventsPerSec = rates[(len(rates)-1)/2]
		med[n] = l.EventsPerSec
		res.Summary = append(res.Summary, l)
	}
	for i := range res.Summary {
		l := &res.Summary[i]
		if e := med[EffectsOnly]; e > 0 {
			l.VsEffects = l.EventsPerSec / e
		}
		if c := med[RawCopy]; c > 0 {
			l.VsRawCopy = l.EventsPerSec / c
		}
	}
	if s, e := med[steady], med[EffectsOnly]; s > 0 && e > 0 {
		res.Price, res.HasPrice = 1-s/e, true
	}
	summarizePrices(res)
}

// summarizePrices sets res.PriceByProtocol from its summary when the
// scenarios ran under several group protocols (steady-classic,
// steady-consumer...); Price and HasPrice are the first's.
func summarizePrices(res *Results) {
	ps := res.Settings.GroupProtocols
	if len(ps) < 2 {
		return
	}
	rate := map[string]float64{}
	for _, l := range res.Summary {
		rate[l.Name] = l.EventsPerSec
	}
	e := rate[EffectsOnly]
	if e <= 0 {
		return
	}
	res.PriceByProtocol = map[string]float64{}
	for i, p := range ps {
		if s := rate[Steady+"-"+p]; s > 0 {
			res.PriceByProtocol[p] = 1 - s/e
			if i == 0 {
				res.Price, res.HasPrice = 1-s/e, true
			}
		}
	}
}

// batch is the members' batch.max_records, which the baselines' batches
// are as large as.
func (b *benchRun) batch() int {
	if n := b.cfg.Consumer.BatchMaxRecords; n > 0 {
		return n
	}
	return 1000 // processor.DefaultBatchMaxRecords
}
