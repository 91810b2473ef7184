package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
)

type options struct {
	brokers     string
	dsn         string
	events      int
	duplicates  float64
	partitions  int
	members     int
	handlers    []string
	batch       int
	poolSize    int
	stormEvery  time.Duration
	naiveEvents int
	scenarios   []string
	baselines   bool
	out         string
	seed        uint64
	short       bool
	replot      string
	spans       bool
	cpuprofile  string
	cpuprofOf   string // the scenario -cpuprofile profiles, or "replay-reread"
	memprofile  string
	brokerPID   int
	rounds      int
	crash       string // kill | abort
	// protocols are the members' processor.GroupProtocols (-group-protocol,
	// a list): the scenarios run under each, side by side.
	protocols []string
	// stormChanges is how many membership changes a storm makes, one
	// every stormEvery (see stormEvents).
	stormChanges int
	// instanceID makes the members static (kafka.instance_id), and a
	// storm's crash a restart under the same id.
	instanceID bool
	format     string // json | avro | protobuf: the records' format (format.go)
	formats    string // -formats: several, each scenario run in each, round by round (format.go)
	registry   string // with avro and protobuf: the schema registry's URL; empty: srfake in process
}

func parseFlags() (options, error) {
	var o options
	var handlers, scenarios string
	flag.StringVar(&o.brokers, "brokers", "", "a real Kafka's brokers (host:port,...); empty: an embedded kfake cluster")
	flag.StringVar(&o.dsn, "dsn", envOr("ONCEFLOW_POSTGRES_DSN", "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow?sslmode=disable"), "Postgres")
	flag.IntVar(&o.events, "events", 1000000, "unique events per scenario (a storm's backlog may be more: see -storm-changes)")
	flag.Float64Var(&o.duplicates, "duplicates", 0.3, "redeliveries among them, per event")
	flag.IntVar(&o.partitions, "partitions", 12, "partitions of the topic")
	flag.IntVar(&o.members, "members", 3, "group members at once")
	flag.StringVar(&handlers, "handlers", orders.Email, "comma-separated handlers applied to each event")
	flag.IntVar(&o.batch, "batch", 1000, "batch.max_records")
	flag.IntVar(&o.poolSize, "pool", 4, "Postgres connections")
	flag.DurationVar(&o.stormEvery, "storm-every", 2*time.Second, "membership change interval in the storm scenario")
	flag.IntVar(&o.naiveEvents, "naive-events", 20000, "unique events for the per-record baselines (they are slow)")
	flag.StringVar(&scenarios, "scenarios", "steady,storm,replay", "scenarios to run")
	flag.BoolVar(&o.baselines, "baselines", true, "run the baselines too")
	flag.StringVar(&o.out, "out", "benchmarks/out", "output directory")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the generated events")
	flag.StringVar(&o.replot, "replot", "", "only redraw results.md and the plots in -out from this results.json")
	flag.BoolVar(&o.spans, "spans", false, "trace the members in process (no exporter) and report span durations by name, "+
		"the CPU split between this process and Postgres, and Postgres' table and WAL statistics of each scenario")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of this process during one scenario (-cpuprofile-of) to this file")
	flag.StringVar(&o.memprofile, "memprofile", "", "write this process's allocations over the scenario -cpuprofile-of profiles to this file, "+
		"and those before it to FILE.base (go tool pprof -sample_index=alloc_space -base FILE.base BINARY FILE)")
	flag.StringVar(&o.cpuprofOf, "cpuprofile-of", "steady", "the scenario -cpuprofile profiles: steady, storm, replay, or replay-reread "+
		"(only the replay's re-read of the half it had applied, from the rewind until the group has committed that half again)")
	flag.IntVar(&o.brokerPID, "broker-pid", 0, "with -spans, the broker's pid, to count its CPU too")
	flag.StringVar(&o.crash, "crash", "kill", "how a storm's crash stops a member: kill (as SIGKILL: it stays in the group until its 3s session "+
		"times out, and a rebalance waits for that) or abort (its transactions roll back and its client leaves the group as it closes)")
	flag.IntVar(&o.rounds, "rounds", 1, "run the scenarios, raw-copy and ceiling this many times, round by round, and report "+
		"each one's median run by rate (rates move 10–20 % between identical runs on a small machine); the per-record baselines run once")
	var protocols string
	flag.StringVar(&protocols, "group-protocol", string(processor.DefaultGroupProtocol), "the members' consumer-group protocol: classic, or consumer "+
		"(KIP-848, Kafka 4.0+; its session timeout is the broker's group.consumer.session.timeout.ms, 45s by default, which a killed member's partitions wait for); "+
		"a list (classic,consumer) runs the scenarios under each, round by round, side by side in one results file")
	flag.IntVar(&o.stormChanges, "storm-changes", 12, "membership changes a storm makes, one every -storm-every (joins, leaves and crashes); "+
		"its backlog is sized from the steady run's rate so that the stream outlasts them")
	flag.BoolVar(&o.instanceID, "instance-id", false, "static members (kafka.instance_id bench-member-N): a storm's crash restarts the member under its id, "+
		"and the partitions that moved to another member meanwhile are counted")
	flag.StringVar(&o.format, "format", "json", "the records' format in the scenarios: json, or avro or protobuf framed for a schema registry "+
		"(encoded before the run; the baselines stay json)")
	flag.StringVar(&o.formats, "formats", "", "run each scenario in each of these formats (e.g. json,avro,protobuf), one after the other in every round, "+
		"and compare each with json's run (overrides -format; the runs are named steady, steady-avro, steady-protobuf)")
	flag.StringVar(&o.registry, "registry", "", "with -format avro or protobuf: the schema registry's URL (infra/schema-registry.sh url); empty: franz-go's srfake in this process")
	flag.BoolVar(&o.short, "short", false, "a quick run (under 2 minutes) that keeps the benchmark working: fewer events, faster storm")
	flag.Parse()
	if o.short {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["events"] {
			o.events = 60000
		}
		if !set["naive-events"] {
			o.naiveEvents = 2000
		}
		if !set["storm-every"] {
			o.stormEvery = 500 * time.Millisecond
		}
		if !set["storm-changes"] {
			o.stormChanges = 10
		}
		if !set["partitions"] {
			o.partitions = 6
		}
	}
	o.handlers = strings.Split(handlers, ",")
	o.protocols = strings.Split(protocols, ",")
	o.scenarios = strings.Split(scenarios, ",")
	var ps []error
	if o.events < 1 || o.naiveEvents < 1 {
		ps = append(ps, errors.New("-events and -naive-events must be at least 1"))
	}
	if o.partitions < 1 || o.members < 1 || o.batch < 1 || o.poolSize < 1 {
		ps = append(ps, errors.New("-partitions, -members, -batch and -pool must be at least 1"))
	}
	if o.crash != "kill" && o.crash != "abort" {
		ps = append(ps, fmt.Errorf("-crash %q: kill or abort", o.crash))
	}
	if len(o.protocols) > 1 && strings.Contains(o.formats, ",") {
		ps = append(ps, errors.New("-formats with several -group-protocol: compare formats under one protocol, or protocols in one format"))
	}
	for i, p := range o.protocols {
		if gp := processor.GroupProtocol(p); gp != processor.ClassicProtocol && gp != processor.ConsumerProtocol || slices.Contains(o.protocols[:i], p) {
			ps = append(ps, fmt.Errorf("-group-protocol %q: %s, %s, or both once each", protocols, processor.ClassicProtocol, processor.ConsumerProtocol))
			break
		}
	}
	if o.instanceID && o.brokers == "" && slices.Contains(o.protocols, string(processor.ConsumerProtocol)) {
		// kfake stops a static member's session timer when it leaves for
		// now (epoch -2): its partitions stay reserved for it forever, and
		// a storm whose static member left never ends. Kafka expires it.
		ps = append(ps, errors.New("-instance-id with -group-protocol consumer needs a real Kafka (-brokers): "+
			"kfake never expires a static member that left, and the storm would wait for its partitions forever"))
	}
	if o.stormChanges < 1 {
		ps = append(ps, errors.New("-storm-changes must be at least 1"))
	}
	if o.rounds < 1 {
		ps = append(ps, errors.New("-rounds must be at least 1"))
	}
	if o.rounds > 1 && (o.cpuprofile != "" || o.memprofile != "") {
		ps = append(ps, errors.New("-cpuprofile and -memprofile profile one run: use them with -rounds 1"))
	}
	if _, err := orders.Handlers("public", o.handlers...); err != nil {
		ps = append(ps, fmt.Errorf("-handlers: %w", err))
	}
	for _, s := range o.scenarios {
		if s != "steady" && s != "storm" && s != "replay" {
			ps = append(ps, fmt.Errorf("-scenarios: unknown scenario %q (steady, storm, replay)", s))
		}
	}
	return o, errors.Join(ps...)
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

// Report is results.json.
type Report struct {
	Command  string   `json:"command"`
	Build    string   `json:"build"` // see build
	Machine  string   `json:"machine"`
	Broker   string   `json:"broker"`
	Handlers []string `json:"handlers"`
	// Crash is how the storm's crashes stopped a member (-crash); empty in
	// reports older than the flag, whose crashes aborted.
	Crash string `json:"crash,omitempty"`
	// GroupProtocol is the members' group protocols (-group-protocol),
	// comma-separated; empty in reports older than the flag, which ran
	// classic.
	GroupProtocol string `json:"group_protocol,omitempty"`
	// InstanceID: the members were static (-instance-id).
	InstanceID bool `json:"instance_id,omitempty"`
	// Protocols compares the scenarios under each group protocol.
	Protocols []ProtocolSummary `json:"protocols,omitempty"`

	StartedAt time.Time `json:"started_at"`
	Runs      []*Run    `json:"runs"`
	Ratios    []Ratio   `json:"ratios"`
	// FormatRatios compares each scenario's run in another format with its
	// json run (-formats).
	FormatRatios []Ratio `json:"format_ratios,omitempty"`
}

// Ratio compares a scenario's unique-events rate with a baseline's.
type Ratio struct {
	Scenario string  `json:"scenario"`
	Baseline string  `json:"baseline"`
	Ratio    float64 `json:"ratio"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "backlog" {
		os.Exit(mainBacklog(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "retention" {
		os.Exit(mainRetention(os.Args[2:]))
	}
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(2)
	}
	if o.replot != "" {
		if err := replot(o.replot, o.out); err != nil {
			fmt.Fprintln(os.Stderr, "benchmarks:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
}

// mainBacklog is `benchmarks backlog`: one onceflow run member draining a
// backlog, optionally on pre-filled tables (see the package doc). It
// returns the exit code.
func mainBacklog(args []string) int {
	o, err := parseBacklogFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks backlog:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runBacklog(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks backlog:", err)
		return 1
	}
	return 0
}

func run(ctx context.Context, o options) error {
	pool, err := pgxpool.New(ctx, o.dsn)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return fmt.Errorf("postgres does not answer (%v); start it with infra/postgres.sh start", err)
	}
	pool.Close()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	broker := "kfake (embedded)"
	if o.brokers != "" {
		broker = "Apache Kafka at " + o.brokers
	}
	rep := &Report{Command: "go run ./benchmarks " + strings.Join(redactDSN(os.Args[1:]), " "), Build: build(""), Machine: machine(),
		Broker: broker, Handlers: o.handlers, Crash: o.crash, GroupProtocol: strings.Join(o.protocols, ","), InstanceID: o.instanceID, StartedAt: time.Now().UTC()}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	b := &bench{o: o, log: log}
	set, err := newFormatSet(ctx, o.formats, o.format, o.registry)
	if err != nil {
		return err
	}
	defer stopFormats(set)
	b.formats = set[0]
	if o.spans {
		b.spans = newSpanRecorder()
		tp, pt := newSpanTracing(b.spans)
		defer tp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // nothing to flush: no exporter
		b.tp, b.pgTracer = tp, pt
	}

	// Round by round, so that whatever drifts while the set runs (the
	// machine's other load, the server's state) falls on every run alike.
	rounds := map[string][]*Run{}
	var order []string
	add := func(r *Run) {
		if rounds[r.Name] == nil {
			order = append(order, r.Name)
		}
		rounds[r.Name] = append(rounds[r.Name], r)
	}
	for round := 1; round <= o.rounds; round++ {
		if o.rounds > 1 {
			progress("round %d of %d", round, o.rounds)
		}
		for _, p := range o.protocols {
			b.protocol = p
			for _, s := range o.scenarios {
				rs, err := b.scenarioInFormats(ctx, s, set)
				if err != nil {
					return fmt.Errorf("scenario %s (%s): %w", s, p, err)
				}
				for _, r := range rs {
					add(r)
				}
			}
		}
		b.protocol = o.protocols[0] // the baselines' groups, if any
		if !o.baselines {
			continue
		}
		for _, name := range baselineNames {
			if round < o.rounds && (name == "per-record-dedup" || name == "naive-per-record") {
				continue // slow, and far from the scenarios: once is enough
			}
			r, err := b.baseline(ctx, name)
			if err != nil {
				return fmt.Errorf("baseline %s: %w", name, err)
			}
			add(r)
		}
	}
	for _, name := range order {
		rep.Runs = append(rep.Runs, medianRun(rounds[name]))
	}
	rates := map[string]float64{}
	for _, r := range rep.Runs {
		rates[r.Name] = r.UniqueEventsPerSec
	}
	for _, p := range o.protocols {
		for _, s := range o.scenarios {
			s = runName(s, p, o.protocols)
			for _, base := range baselineNames {
				if rates[base] > 0 {
					rep.Ratios = append(rep.Ratios, Ratio{s, base, rates[s] / rates[base]})
				}
			}
		}
	}
	if len(set) > 1 {
		rep.FormatRatios = formatRatios(o.scenarios, set, rates)
	}
	rep.Protocols = summarize(o, rounds)
	if err := writeOutputs(o.out, rep); err != nil {
		return err
	}
	failed := 0
	for _, name := range order {
		for _, r := range rounds[name] {
			if r.Kind == "scenario" && !r.ExactlyOnce {
				failed++
				fmt.Fprintf(os.Stderr, "benchmarks: scenario %s: effects NOT exactly once: %v\n", r.Name, r.Problems)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", strings.Join([]string{filepath.Join(o.out, "results.json"), filepath.Join(o.out, "results.md"),
		filepath.Join(o.out, "throughput-*.png")}, ", "))
	if failed > 0 {
		return fmt.Errorf("%d scenario runs failed the exactly-once check", failed)
	}
	return nil
}

// medianRun returns the run to report of one name's rounds: the median by
// unique events/s (the lower of the two middle ones for an even count),
// with every round's rate in Rounds when there are several; or the first
// round whose effects were not exactly once, which no median may hide.
func medianRun(rs []*Run) *Run {
	for _, r := range rs {
		if !r.ExactlyOnce {
			return r
		}
	}
	if len(rs) == 1 {
		return rs[0]
	}
	rates := make([]float64, len(rs))
	for i, r := range rs {
		rates[i] = r.UniqueEventsPerSec
	}
	byRate := slices.Clone(rs)
	slices.SortStableFunc(byRate, func(a, b *Run) int { return cmp.Compare(a.UniqueEventsPerSec, b.UniqueEventsPerSec) })
	m := byRate[(len(byRate)-1)/2]
	m.Rounds = rates
	m.RoundsRecoveryMs, m.RoundsRestartRecoveryMs = make([]float64, len(rs)), make([]float64, len(rs))
	for i, r := range rs {
		m.RoundsRecoveryMs[i], m.RoundsRestartRecoveryMs[i] = r.RecoveryMedianMs, r.RestartRecoveryMs
	}
	return m
}

// baselineNames are the baselines, in the order they run and are reported.
var baselineNames = []string{"raw-copy", "ceiling", "per-record-dedup", "naive-per-record"}

func replot(from, out string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	return writeOutputs(out, &rep)
}

// build names the code a run measures: the commit checked out where the
// benchmark runs, "+dirty" when files other than committed results differ
// from it (a run writes its results into the tree); with bin (a prebuilt
// member binary), that binary's path too, whose code may differ.
func build(bin string) string {
	out, err := exec.Command("git", "rev-parse", "--short=7", "HEAD").Output()
	s := strings.TrimSpace(string(out))
	if err != nil || s == "" {
		s = "unknown (not run from a git checkout)"
	} else if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--",
		":(top)", ":(top,exclude)benchmarks/results*").Output(); err != nil || len(bytes.TrimSpace(st)) > 0 {
		s += "+dirty"
	}
	if bin != "" {
		s += "; members run " + bin
	}
	return s
}

func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				model = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
	}
	return fmt.Sprintf("%d cores (%s), %s RAM, %s, %s", runtime.NumCPU(), model, mem, runtime.Version(), "PostgreSQL 15 (local)")
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
