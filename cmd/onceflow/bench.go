package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/onceflow/onceflow/bench"
	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/processor"
	schemaregistry "github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/sink"
)

type benchOptions struct {
	sample, template string
	events           int
	duplicates       float64
	otherPartition   float64 // with the flag set only
	partitions       int
	members          int
	scenarios        []string
	rounds           int
	brokers          string
	topic            string
	stormEvery       time.Duration
	stormChanges     int
	protocols        []string
	instanceID       bool
	checkpoint       bool
	cpuprofile       string
	cpuprofileOf     string
	formats          []string
	avroSchema       string
	protobufSchema   string
	schemaRegistry   string
	pool             int
	baselineWriters  int
	seed             uint64
	keep             bool
	noRawCopy        bool
	out              string
	compare          string
	schema           string
	dropLeftovers    bool
}

// brokersFromConfig is --brokers given alone: the config's kafka.brokers.
const brokersFromConfig = "config"

func newBenchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench --config FILE (--sample FILE.jsonl | --template FILE.json)",
		Short: "Load-benchmark the config's handlers: events/s under steady, storm and replay, against writing the rows directly",
		Long: `bench runs the config's handlers (sql_handlers, and handlers) over a generated
stream through the pipeline run uses, in a consumer group of --members
members, and measures unique events per second in each scenario:

  steady   the group keeps still
  storm    --storm-changes membership changes, spread over the stream, at
           least 0.5 s apart (or one every --storm-every): a member joins, the
           oldest leaves, and every third change the oldest is killed (as
           SIGKILL: its partitions wait for the session timeout) and a
           replacement joins; none is made once the stream is consumed, and
           the report says how many were (raise --events for all)
  replay   half-way the group stops, and a group with no stored offsets reads
           the topic again from its start: what was applied must apply nothing

and, on the same unique events, two baselines: effects-only (the handlers
over the events in batches, no dedup rows, no Kafka: your rows written
directly) and raw-copy (effects-only plus the dedup rows by COPY). The report
gives each as events/s and as ratios to both, and the price of exactly-once:
1 − steady/effects-only. Every run is checked from its tables: each unique
event claimed once per handler, no dead letter, and the written tables
holding what effects-only wrote.

Payloads come from --sample (JSON lines, used in turn) or --template (a JSON
document whose strings may hold {{uuid}}, {{event_id}}, {{seq}},
{{int MIN MAX}}, {{decimal MIN MAX SCALE}}, {{choice 'A' 'B'}}, {{now}},
{{timestamp FROM TO}}, {{string FUNC ARGS}}). --duplicates of the events are
delivered again (same id and payload), a third of those on another partition
(--other-partition sets the share): a batch of that partition may claim the
event before the first delivery's transaction commits, and waits for it.

Your tables are never written: each run has a schema of its own
(<--bench-schema>_<random>_<run>_r<round>, e.g.
onceflow_bench_1a2b3c4d_steady_r1) with onceflow's tables and the Go
handlers', and beside it <that>_t holding empty clones of the tables the SQL
handlers write (CREATE TABLE … (LIKE … INCLUDING ALL)) and of the sequences
they use, first on the search_path of the benchmark's connections. When a
handler's writes cannot be redirected there (a schema-qualified table or
sequence, a trigger, a rule, a volatile function of yours, set_config, a
default, check or index calling a function of yours that is not IMMUTABLE)
bench refuses and names them. The schemas are dropped at the end; --keep
leaves them.

Kafka: an embedded kfake by default. --brokers alone uses the config's
kafka.brokers (over kafka.tls and kafka.sasl), --brokers=HOST:PORT,...
others; on them bench creates a topic of its own and deletes it at the end,
never the config's topics.

Each run also gives its committed batches' latency (p50, p99), this
process's peak RSS, and the checkpoints Postgres began during it
(--checkpoint runs CHECKPOINT before each run, so that runs writing the same
WAL meet the server's checkpoints at the same places; the role needs
pg_checkpoint); a storm, each change's recovery time and how long partitions
waited with no owner; a replay, how long after the re-read's start its records
rate was back at 90 % of the first read's. --group-protocol classic,consumer runs the scenarios
under both, side by side; --instance-id makes the storm's members static
(a kill becomes a restart under the same id, and the partitions that moved
meanwhile are counted). --cpuprofile FILE profiles the steady run (or
--cpuprofile-of's).

Output: a progress line on stderr, the table on stdout, results.json and
results.md in --out; --compare OLD/results.json prints the difference,
pairing runs by scenario and group protocol (steady with an earlier
steady-classic). The stream is held in memory: --events with its
--duplicates make at most 10 000 000 records.

Ctrl-C, SIGTERM or a closed output (| head) interrupts a run, which drops
its schemas and topic. A run killed outright (SIGKILL) leaves them: each
run holds a Postgres advisory lock for its life, and the next one lists at
its start the schemas (and with --brokers the topics) that no running bench
holds, with the commands that drop them; --drop-leftovers drops them (alone,
without --sample or --template, it only drops).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.sample, "sample", "", "payloads: a file of JSON lines, used in turn")
	f.StringVar(&o.template, "template", "", "payloads: a JSON template ({{int 1 100}}, {{decimal 0.01 999.99 2}}, ...; see --help)")
	f.IntVar(&o.events, "events", 100000, fmt.Sprintf("unique events per run; with --duplicates' redeliveries at most %d records, "+
		"since the stream is held in memory for the whole run (about %d bytes a record besides its payload, and the embedded kfake holds the topic too)",
		bench.MaxRecords, bench.RecordBytes))
	f.Float64Var(&o.duplicates, "duplicates", 0.3, "redeliveries per event, 0 to 1")
	f.Float64Var(&o.otherPartition, "other-partition", 0, "the share of the redeliveries sent to another partition than their event's first delivery, 0 to 1 (default: a third)")
	f.IntVar(&o.partitions, "partitions", 12, fmt.Sprintf("partitions of the benchmark's topic, at most %d", bench.MaxPartitions))
	f.IntVar(&o.members, "members", 3, "group members at once")
	f.StringSliceVar(&o.scenarios, "scenarios", []string{bench.Steady, bench.Storm, bench.Replay}, "scenarios: steady, storm, replay")
	f.IntVar(&o.rounds, "rounds", 1, "run everything this many times and report the median round (of an even number, the lower of the middle two)")
	f.StringVar(&o.brokers, "brokers", "", "a real Kafka: alone, the config's kafka.brokers; =HOST:PORT,... others (default: embedded kfake)")
	f.Lookup("brokers").NoOptDefVal = brokersFromConfig
	f.StringVar(&o.topic, "topic", "", "the topic the stream stands for (default: the first of kafka.topics)")
	f.DurationVar(&o.stormEvery, "storm-every", 0, "pace the storm by time: a change every this long (a stream consumed before the last change is said in the report); "+
		"0: the changes spread evenly over the stream")
	f.IntVar(&o.stormChanges, "storm-changes", 12, "membership changes a storm makes: joins, leaves, and every third a kill")
	f.StringSliceVar(&o.protocols, "group-protocol", nil, "the members' group protocol, overriding kafka.group_protocol: classic or consumer; "+
		"classic,consumer runs the scenarios under each, side by side in one report")
	f.BoolVar(&o.instanceID, "instance-id", false, "static storm members (instance ids onceflow-bench-member-N): a kill restarts the member under its id, "+
		"and the partitions another member ran meanwhile are counted (kafka.instance_id is not used)")
	f.StringSliceVar(&o.formats, "formats", nil, "besides JSON, run the scenarios with the payloads in these formats too (avro, protobuf), "+
		"encoded with --avro-schema or --protobuf-schema for --schema-registry (or a registry in this process); on the embedded Kafka")
	f.StringVar(&o.schemaRegistry, "schema-registry", "", "with --formats: the schema registry's URL (its other settings from decode.schema_registry); empty: one in this process")
	f.StringVar(&o.avroSchema, "avro-schema", "", "with --formats avro: the payloads' Avro schema (.avsc)")
	f.StringVar(&o.protobufSchema, "protobuf-schema", "", "with --formats protobuf: the payloads' .proto file (its first message)")
	f.BoolVar(&o.checkpoint, "checkpoint", false, "run CHECKPOINT before each run (the role needs pg_checkpoint), so that runs meet the server's checkpoints at the same places")
	f.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of this process during the first round's --cpuprofile-of run to this file (go tool pprof)")
	f.StringVar(&o.cpuprofileOf, "cpuprofile-of", bench.Steady, "the run --cpuprofile profiles: steady, storm, replay, effects-only or raw-copy")
	f.IntVar(&o.pool, "pool", 0, "Postgres connections of the benchmark, shared by the members and the baselines' writers (default postgres.pool_size)")
	f.IntVar(&o.baselineWriters, "baseline-writers", 0, "writers of effects-only and raw-copy at once, at most --pool (default: the fastest of the pool, its half, …, 1, measured over the first 50 000 events before the rounds)")
	f.Uint64Var(&o.seed, "seed", 1, "the stream's seed: the same seed gives the same ids and payloads ({{now}} and the records' timestamps aside)")
	f.BoolVar(&o.keep, "keep", false, "leave the runs' schemas for inspection")
	f.BoolVar(&o.noRawCopy, "no-raw-copy", false, "skip the raw-copy baseline (effects-only always runs: it is the tables' reference)")
	f.StringVar(&o.out, "out", "onceflow-bench", "directory for results.json, results.md and the throughput plots")
	f.StringVar(&o.compare, "compare", "", "an earlier results.json: print the difference")
	f.BoolVar(&o.dropLeftovers, "drop-leftovers", false, "drop, at the start, the schemas of --bench-schema (with --brokers, the topics <topic>-bench-*) "+
		"that killed runs left and no running bench holds; without --sample or --template, drop them and stop")
	f.StringVar(&o.schema, "bench-schema", "onceflow_bench", "prefix of the runs' schemas: lower-case letters, digits and _, at most 30, not pg_")
	return cmd
}

// benchBinds are the config flags of bench: all but --brokers, which is
// bench's own.
var benchBinds = slices.DeleteFunc(slices.Clone(binds), func(f config.Flag) bool { return f.Name == "brokers" })

func runBench(cmd *cobra.Command, o benchOptions) (err error) {
	var ps []error
	// --drop-leftovers alone drops what killed runs left, and runs
	// nothing: it needs the database (and the brokers), no payloads.
	dropOnly := o.dropLeftovers && o.sample == "" && o.template == ""
	// Without a config there are only the demo's Go handlers (the
	// registry's defaults), which parse the demo's orders: on a user's
	// payloads they would fail after the stream is produced, naming no
	// sample line.
	if file, _ := cmd.Flags().GetString("config"); file == "" && !dropOnly {
		ps = append(ps, errors.New("no --config: bench measures a config's handlers on your payloads (benchmarks/demo.yaml is the demo's, for benchmarks/orders.jsonl)"))
	}
	switch {
	case dropOnly:
	case o.sample == "" && o.template == "":
		ps = append(ps, errors.New("no payloads: give --sample FILE.jsonl or --template FILE.json"))
	case o.sample != "" && o.template != "":
		ps = append(ps, errors.New("--sample and --template: give one"))
	}
	// 0 is a default to bench.Config, a value given here.
	for _, f := range []struct {
		name string
		v    int
	}{{"events", o.events}, {"partitions", o.partitions}, {"members", o.members}, {"rounds", o.rounds}, {"storm-changes", o.stormChanges}} {
		if f.v < 1 {
			ps = append(ps, fmt.Errorf("--%s %d: at least 1", f.name, f.v))
		}
	}
	flags := cmd.Flags()
	if flags.Changed("pool") && o.pool < 1 {
		ps = append(ps, fmt.Errorf("--pool %d: at least 1 (leave it out for postgres.pool_size)", o.pool))
	}
	if flags.Changed("baseline-writers") && o.baselineWriters < 1 {
		ps = append(ps, fmt.Errorf("--baseline-writers %d: at least 1 (leave it out to measure the fastest)", o.baselineWriters))
	}
	var scenarios []string
	for _, s := range o.scenarios {
		scenarios = append(scenarios, strings.TrimSpace(s))
	}
	if len(scenarios) == 0 {
		ps = append(ps, fmt.Errorf("--scenarios: none given (%s, %s, %s, or some of them)", bench.Steady, bench.Storm, bench.Replay))
	}
	var protocols []processor.GroupProtocol
	for _, p := range o.protocols {
		gp := processor.GroupProtocol(strings.TrimSpace(p))
		if gp != processor.ClassicProtocol && gp != processor.ConsumerProtocol {
			ps = append(ps, fmt.Errorf("--group-protocol %q: %s, %s, or both", p, processor.ClassicProtocol, processor.ConsumerProtocol))
			continue
		}
		if slices.Contains(protocols, gp) {
			ps = append(ps, fmt.Errorf("--group-protocol: %s listed twice", gp))
			continue
		}
		protocols = append(protocols, gp)
	}
	var formats []processor.Format
	for _, f := range o.formats {
		switch pf := processor.Format(strings.TrimSpace(f)); {
		case pf == processor.FormatJSON: // always run
		case pf != processor.FormatAvro && pf != processor.FormatProtobuf:
			ps = append(ps, fmt.Errorf("--formats %q: avro, protobuf (json always runs)", f))
		case slices.Contains(formats, pf):
			ps = append(ps, fmt.Errorf("--formats: %s listed twice", pf))
		default:
			formats = append(formats, pf)
		}
	}
	if slices.Contains(formats, processor.FormatAvro) != (o.avroSchema != "") {
		ps = append(ps, errors.New("--formats avro and --avro-schema go together"))
	}
	if slices.Contains(formats, processor.FormatProtobuf) != (o.protobufSchema != "") {
		ps = append(ps, errors.New("--formats protobuf and --protobuf-schema go together"))
	}
	// The flags' values as bench.Config checks them, before anything is
	// loaded or run; what only the config gives (the pool, the handlers,
	// the payloads, the topic) is checked once loaded.
	early := bench.Config{Events: o.events, Duplicates: o.duplicates, OtherPartition: o.other(cmd), Partitions: o.partitions, Members: o.members,
		Scenarios: scenarios, Rounds: o.rounds, StormEvery: o.stormEvery, StormChanges: o.stormChanges,
		GroupProtocols: protocols, InstanceID: o.instanceID, CPUProfileOf: o.cpuprofileOf, Schema: o.schema, NoRawCopy: o.noRawCopy,
		PoolSize: max(o.pool, 1)}
	if o.brokers != "" {
		early.Brokers = []string{o.brokers}
	}
	if o.cpuprofile != "" {
		early.CPUProfile = io.Discard
	}
	for _, p := range bench.Problems(early.Validate()) {
		var ce *bench.ConfigError
		if errors.As(p, &ce) && (slices.Contains([]string{"Pool", "Handlers", "Payloads", "Topic", "GroupProtocols"}, ce.Field) ||
			slices.Contains([]string{"Events", "Partitions", "Members", "Rounds", "StormChanges", "PoolSize"}, ce.Field) && ce.Problem == "at least 1") {
			continue // checked above, or once the config is loaded
		}
		ps = append(ps, flagProblem(p))
	}
	// --out and --compare before the run, which may take minutes: the
	// earlier results are read now, before this run's overwrite them in
	// the same --out.
	var created string
	if !dropOnly {
		if created, err = usableDir(o.out); err != nil {
			ps = append(ps, err)
		}
	}
	var old *bench.Results
	if o.compare != "" {
		var err error
		if old, err = bench.ReadResults(o.compare); err != nil {
			ps = append(ps, fmt.Errorf("--compare: %w", err))
		}
	}
	// A run that writes nothing to --out leaves no directory it made.
	defer func() {
		if created != "" {
			removeEmptyDirs(o.out, created)
		}
	}()
	// The flags' problems above, what the loaded config says of them and
	// the payloads' file are listed together.
	if file, _ := flags.GetString("config"); file == "" {
		if err := errors.Join(ps...); err != nil {
			return err
		}
	}
	a, err := loadBinding(cmd, benchBinds)
	if err != nil {
		return errors.Join(append(ps, err)...)
	}
	topic := o.topic
	if topic == "" && len(a.cfg.Kafka.Topics) > 0 {
		topic = a.cfg.Kafka.Topics[0]
	}
	var brokers []string
	switch o.brokers {
	case "":
	case brokersFromConfig:
		brokers = a.cfg.Kafka.Brokers
	default:
		brokers = strings.Split(o.brokers, ",")
	}
	if dropOnly {
		if err := errors.Join(ps...); err != nil {
			return err
		}
		return dropLeftovers(cmd, a, bench.Config{Schema: o.schema, Topic: topic, Brokers: brokers})
	}
	size, of := o.pool, "--pool"
	if !flags.Changed("pool") {
		size, of = a.cfg.Postgres.PoolSize, "postgres.pool_size"
	}
	if size >= 1 && o.baselineWriters > size {
		ps = append(ps, fmt.Errorf("--baseline-writers %d: at most one writer per connection of the pool (%d, %s); leave it out to measure the fastest", o.baselineWriters, size, of))
	}
	var payloads *bench.Payloads
	if path, isTemplate := cmp.Or(o.template, o.sample), o.template != ""; path != "" && (o.sample == "" || o.template == "") {
		if payloads, err = bench.LoadPayloads(path, isTemplate); err != nil {
			flag := "--sample"
			if isTemplate {
				flag = "--template"
			}
			ps = append(ps, fmt.Errorf("%s: %w", flag, err))
		}
	}
	if err := errors.Join(ps...); err != nil {
		return err
	}
	pool, err := a.openPool(cmd.Context(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	handlers, skipped, err := a.benchHandlers(topic)
	if err != nil {
		return err
	}
	for _, s := range skipped {
		fmt.Fprintf(cmd.ErrOrStderr(), "onceflow bench: handler %s does not consume %s: left out\n", s, topic)
	}
	cc := a.consumerTuning("onceflow-bench")
	cc.KafkaOptions, cc.InstanceID = nil, "" // the members are bench's own: --instance-id
	lru := a.cfg.Dedup.LRUSize
	if lru == 0 {
		lru = -1
	}
	cfg := bench.Config{
		Pool: pool, Handlers: handlers, Migrate: registry.migrator(a.cfg.Handlers),
		Consumer: cc, Writer: a.writerTuning(), LRUSize: lru, PoolSize: size, BaselineWriters: o.baselineWriters,
		Brokers: brokers, Topic: topic, Payloads: payloads,
		Events: o.events, Duplicates: o.duplicates, OtherPartition: o.other(cmd), Partitions: o.partitions, Members: o.members,
		Scenarios: scenarios, Rounds: o.rounds, StormEvery: o.stormEvery, StormChanges: o.stormChanges, Seed: o.seed,
		GroupProtocols: protocols, InstanceID: o.instanceID, Checkpoint: o.checkpoint, CPUProfileOf: o.cpuprofileOf,
		Schema: o.schema, Keep: o.keep, NoRawCopy: o.noRawCopy, DropLeftovers: o.dropLeftovers,
		Progress: cmd.ErrOrStderr(), Logger: benchLogger(a.cfg.Log),
	}
	if len(brokers) > 0 {
		cfg.KafkaOptions = a.kafkaSecurity
	}
	if len(formats) > 0 {
		fs, stop, err := benchFormats(cmd.Context(), a.cfg.Decode, o.schemaRegistry, topic, formats, o.avroSchema, o.protobufSchema)
		if err != nil {
			return err
		}
		defer stop()
		cfg.Formats = fs
	}
	if o.cpuprofile != "" {
		cfg.CPUProfile = io.Discard // for Validate: the file is made once the settings are good
	}
	if err := cfg.Validate(); err != nil {
		var fps []error
		for _, p := range bench.Problems(err) {
			fps = append(fps, flagProblem(p))
		}
		return errors.Join(fps...)
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		cfg.CPUProfile = f
		defer func() {
			if cerr := f.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("--cpuprofile: %w", cerr))
			}
		}()
	}
	// The checkout is read before the run: a run takes minutes, and a
	// commit or a merge made meanwhile is not the code that ran.
	checkout := checkoutBuild()
	// A closed stdout or stderr (bench ... | head) interrupts the run as
	// Ctrl-C does, so that it drops its schemas and topic: by default Go
	// ends a process that writes to a broken pipe on fd 1 or 2 at once.
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGPIPE)
	defer stop()
	res, runErr := bench.Run(ctx, cfg)
	if interrupted := runErr != nil && ctx.Err() != nil; interrupted || res == nil || len(res.Summary) == 0 {
		if o.keep && res != nil && len(res.Schemas) > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "kept schemas: %s\n", keptSchemas(res))
		}
		if interrupted {
			return errors.New("interrupted: nothing written to --out")
		}
		return runErr
	}
	if res.Settings.Build == "" {
		res.Settings.Build = checkout
	}
	// The files before the table: a stdout closed meanwhile (| head)
	// fails the table, not the results.
	created = "" // --out is written
	werr := res.WriteFiles(o.out, benchCommandLine(os.Args[1:]))
	out := cmd.OutOrStdout()
	// The blank line parts the progress from the table on a terminal; on
	// stderr, so that stdout is the table from its first line.
	fmt.Fprintln(cmd.ErrOrStderr())
	if err := res.WriteTable(out); err != nil {
		return errors.Join(runErr, err)
	}
	if werr != nil {
		return errors.Join(runErr, fmt.Errorf("--out: %w", werr))
	}
	fmt.Fprintf(out, "results: %s/results.json, %s/results.md\n", o.out, o.out)
	if o.keep {
		fmt.Fprintf(out, "kept schemas: %s\n", keptSchemas(res))
	}
	if old != nil {
		fmt.Fprintf(out, "\ncompared with %s (read before this run):\n", o.compare)
		if err := bench.Compare(out, old, res); err != nil {
			return errors.Join(runErr, err)
		}
	}
	return runErr
}

// other is --other-partition when it is given, else nil (bench's default).
func (o *benchOptions) other(cmd *cobra.Command) *float64 {
	if !cmd.Flags().Changed("other-partition") {
		return nil
	}
	return &o.otherPartition
}

// benchFlags are bench.Config's fields by the flag or the config key
// that sets them.
var benchFlags = map[string]string{
	"Events": "--events", "Duplicates": "--duplicates", "OtherPartition": "--other-partition", "Partitions": "--partitions", "Members": "--members",
	"Scenarios": "--scenarios", "Rounds": "--rounds", "StormChanges": "--storm-changes", "StormEvery": "--storm-every",
	"GroupProtocols": "--group-protocol", "InstanceID": "--instance-id", "Formats": "--formats", "CPUProfileOf": "--cpuprofile-of",
	"Schema": "--bench-schema", "PoolSize": "--pool", "BaselineWriters": "--baseline-writers", "Brokers": "--brokers", "NoRawCopy": "--no-raw-copy", "Topic": "--topic",
	"Consumer.Decode.Format": "decode.format", "Consumer.Decode.IDSource": "decode.event_id_source",
}

// flagProblem is a problem of bench.Config.Validate said with the flag
// (or config key) that sets its field: "--duplicates 5: a share from 0
// to 1", not "bench: Duplicates 5: ...". Other errors are returned as
// they are.
func flagProblem(err error) error {
	var ce *bench.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	name, ok := benchFlags[ce.Field]
	if !ok {
		return err
	}
	// The problem's words that name fields are said by their flags.
	words := strings.Fields(ce.Problem)
	for i, w := range words {
		core := strings.TrimRight(strings.TrimLeft(w, "("), "):,")
		if f, ok := benchFlags[core]; ok && core != "Topic" {
			words[i] = strings.Replace(w, core, f, 1)
		}
	}
	msg := strings.Join(words, " ")
	if ce.Value != "" {
		return fmt.Errorf("%s %s: %s", name, ce.Value, msg)
	}
	if ce.Field == "Topic" {
		msg = "no topic: give --topic or kafka.topics"
	}
	return errors.New(msg)
}

// usableDir checks that dir can take bench's output files: a directory
// (created if missing, with its missing parents: created is the first of
// them, "" when dir was there) in which a file can be written.
func usableDir(dir string) (created string, err error) {
	st, err := os.Stat(dir)
	switch {
	case err == nil && !st.IsDir():
		return "", fmt.Errorf("--out %s: not a directory", dir)
	case errors.Is(err, os.ErrNotExist):
		created = filepath.Clean(dir)
		for p := filepath.Dir(created); p != created; p = filepath.Dir(p) {
			if _, err := os.Stat(p); err == nil {
				break
			}
			created = p
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("--out: %w", err)
		}
	case err != nil:
		return "", fmt.Errorf("--out: %w", err)
	}
	f, err := os.CreateTemp(dir, ".onceflow-bench-*")
	if err != nil {
		return created, fmt.Errorf("--out %s: not writable: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	_ = os.Remove(name)
	return created, nil
}

// removeEmptyDirs removes dir and its parents up to top, which usableDir
// made, while they are empty: what was there, or was put there since, is
// left.
func removeEmptyDirs(dir, top string) {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if os.Remove(d) != nil || d == top || filepath.Dir(d) == d {
			return
		}
	}
}

// dropLeftovers drops the schemas and topics of c.Schema and c.Topic that
// killed runs left and no running bench holds (bench.FindLeftovers), and
// says which.
func dropLeftovers(cmd *cobra.Command, a *app, c bench.Config) error {
	pool, err := a.openPool(cmd.Context(), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	c.Pool = pool
	if len(c.Brokers) > 0 {
		c.KafkaOptions = a.kafkaSecurity
	}
	l, err := bench.FindLeftovers(cmd.Context(), c, "", true)
	if err != nil {
		return err
	}
	if l.Empty() {
		fmt.Fprintf(cmd.OutOrStdout(), "no leftovers of %s_* runs\n", c.Schema)
		return nil
	}
	fmt.Fprint(cmd.OutOrStdout(), l.Report(true))
	return nil
}

// benchHandlers returns the handlers of the config that consume topic,
// built for a schema, and the names of those left out. sql_handlers
// with topics are rebuilt without them: the stream is topic's, whatever
// the benchmark's topic is called.
func (a *app) benchHandlers(topic string) (func(schema string) ([]sink.Handler, error), []string, error) {
	var skipped []string
	var sqls []sink.SQLHandlerConfig
	for _, c := range a.cfg.SQLHandlers {
		if len(c.Topics) > 0 && !slices.Contains(c.Topics, topic) {
			skipped = append(skipped, c.Name)
			continue
		}
		sqls = append(sqls, sink.SQLHandlerConfig{Name: c.Name, SQL: c.SQL, RawValues: a.cfg.Decode.Format == string(processor.FormatBytes)})
	}
	build := func(schema string) ([]sink.Handler, error) {
		hs, err := registry.build(schema, a.cfg.Handlers)
		if err != nil {
			return nil, err
		}
		hs = slices.DeleteFunc(hs, func(h sink.Handler) bool {
			f, ok := h.(sink.TopicFilter)
			return ok && !f.Consumes(topic)
		})
		for _, c := range sqls {
			h, err := sink.NewSQLHandler(c)
			if err != nil {
				return nil, err
			}
			hs = append(hs, h)
		}
		return hs, nil
	}
	if _, err := build("onceflow_bench_probe"); err != nil { // builds nothing in Postgres: the config's errors now
		return nil, nil, err
	}
	return build, skipped, nil
}

// benchLogger is the members' logger: warnings and errors only (their
// start-up lines would bury the progress), unless log.level is debug.
func benchLogger(c config.Log) *slog.Logger {
	if c.Level != "debug" {
		c.Level = "warn"
	}
	return newLogger(c)
}

func keptSchemas(res *bench.Results) string {
	return strings.Join(res.Schemas, ", ")
}

// benchCommandLine is the command line results.md quotes, the password
// of --dsn masked (config.RedactDSN).
func benchCommandLine(args []string) string {
	out := slices.Clone(args)
	for i, a := range out {
		switch {
		case a == "--dsn" && i+1 < len(out):
			out[i+1] = config.RedactDSN(out[i+1])
		case strings.HasPrefix(a, "--dsn="):
			out[i] = "--dsn=" + config.RedactDSN(strings.TrimPrefix(a, "--dsn="))
		}
	}
	return "onceflow " + strings.Join(out, " ")
}

// checkoutBuild names the code of a binary built without VCS stamps
// (-buildvcs=false) from the git checkout it runs in: the commit, "+dirty"
// when files other than benchmark results differ from it; "" outside a
// checkout.
func checkoutBuild() string {
	out, err := exec.Command("git", "rev-parse", "--short=7", "HEAD").Output()
	s := strings.TrimSpace(string(out))
	if err != nil || s == "" {
		return ""
	}
	st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--",
		":(top)", ":(top,exclude)benchmarks/results*", ":(top,exclude)benchmarks/out").Output()
	if err != nil || len(strings.TrimSpace(string(st))) > 0 {
		s += "+dirty"
	}
	return s + " (this checkout)"
}

// benchFormats makes bench's formats: for each, an encoder that
// registers the schema file under <topic>-bench-<format>-value, and a
// decoder, at the registry url (with decode.schema_registry's other
// settings: credentials, TLS), or, when url is empty, at a registry in
// this process (franz-go's srfake), which stop closes.
func benchFormats(ctx context.Context, d config.Decode, url, topic string, formats []processor.Format, avroFile, protoFile string) (_ []bench.Format, stop func(), err error) {
	stop = func() {}
	rc := schemaregistry.Config{}
	if url != "" {
		if rc, err = d.RegistryConfig(); err != nil {
			return nil, stop, err
		}
		rc.URL = url
	} else {
		fake := srfake.New()
		stop, rc.URL = fake.Close, fake.URL()
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	dec, err := schemaregistry.New(rc)
	if err != nil {
		return nil, stop, fmt.Errorf("decode.schema_registry: %w", err)
	}
	var out []bench.Format
	for _, f := range formats {
		src, flag := schemaregistry.Source{Kind: schemaregistry.Avro, Path: avroFile}, "--avro-schema"
		if f == processor.FormatProtobuf {
			src, flag = schemaregistry.Source{Kind: schemaregistry.Protobuf, Path: protoFile}, "--protobuf-schema"
		}
		b, err := os.ReadFile(src.Path)
		if err != nil {
			return nil, stop, fmt.Errorf("%s: %w", flag, err)
		}
		src.Text = string(b)
		enc, err := schemaregistry.NewEncoder(ctx, rc, topic+"-bench-"+string(f)+"-value", src)
		if err != nil {
			return nil, stop, fmt.Errorf("%s: %w", flag, err)
		}
		out = append(out, bench.Format{Name: f, Encoder: enc, Decoder: dec})
	}
	return out, stop, nil
}
