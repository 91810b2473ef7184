package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Exit statuses.
const (
	exitPass    = 0
	exitFail    = 1 // the guarantee did not hold
	exitSetup   = 2 // bad flags, or the run could not be set up
	exitInvalid = 3 // the harness or the broker lost data: the run proves nothing
)

type options struct {
	seed     uint64
	short    bool
	duration time.Duration
	gap      time.Duration
	settle   time.Duration
	minKills int

	events      int
	duplicates  float64
	backlog     float64 // share of the records published before the members start
	partitions  int
	members     int
	batch       int
	faults      []faultKind
	poison      []string
	poisonScale int
	maxRecord   int
	session     time.Duration
	// protocol is the members' kafka.group_protocol: classic or consumer,
	// picked by the seed unless -group-protocol names one.
	protocol string

	bin       string
	memberEnv []string
	out       string
	keep      bool

	kafkaPort, ctrlPort, pgPort, proxyPort int
	kafkaDir                               string

	format       string // json, avro or protobuf (format.go); -format seed resolved
	registryPort int    // the chaos schema registry's port (avro)
	registryDir  string
}

type envList []string

func (e *envList) String() string { return strings.Join(*e, " ") }
func (e *envList) Set(s string) error {
	k, _, ok := strings.Cut(s, "=")
	if !ok || !strings.HasPrefix(k, "ONCEFLOW_") {
		return fmt.Errorf("%q is not ONCEFLOW_KEY=value", s)
	}
	*e = append(*e, s)
	return nil
}

// parseFlags reads the command line; long only because it lists every flag.
func parseFlags(args []string) (options, error) {
	var o options
	var faults, poison string
	var env envList
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./chaos [flags]   (see chaos/doc.go)")
		fs.PrintDefaults()
	}
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the workload and of the fault schedule; 0: a new one, printed")
	fs.BoolVar(&o.short, "short", false, "the short run of make chaos and CI (under 4 minutes): fewer events, a 75s fault window")
	fs.DurationVar(&o.duration, "duration", 30*time.Minute, "how long faults are injected while the producer publishes")
	fs.DurationVar(&o.gap, "gap", 4*time.Second, "mean time between two faults")
	fs.DurationVar(&o.settle, "settle", 3*time.Minute, "bound on the wait, after the faults stop, for every partition to reach its end")
	fs.IntVar(&o.minKills, "min-kills", 250, "at least this many SIGKILLs of members (when kill is among -faults and the window has room)")
	fs.IntVar(&o.events, "events", 500000, "unique good events (the seed's orders)")
	fs.Float64Var(&o.duplicates, "duplicates", 0.3, "redeliveries per event (same id and payload; some on another partition)")
	fs.Float64Var(&o.backlog, "backlog", 0.25, "share of the records published before the members start, at once: a backlog that fills their queues")
	fs.IntVar(&o.partitions, "partitions", 12, "partitions of the source topic")
	fs.IntVar(&o.members, "members", 3, "onceflow run members in the group (storms add more for a while)")
	fs.IntVar(&o.batch, "batch", 500, "the members' batch.max_records")
	fs.StringVar(&faults, "faults", "all", "faults to inject: all, none, or a list of "+joinKinds(allFaults))
	fs.StringVar(&poison, "poison", "all", "poison to inject: all, none, or a list of kinds (see doc.go)")
	fs.IntVar(&o.poisonScale, "poison-scale", 3, "copies of each poison kind, times its base count")
	fs.IntVar(&o.maxRecord, "max-record-bytes", 1<<20, "the members' decode.max_record_bytes")
	fs.DurationVar(&o.session, "session-timeout", 3*time.Second, "the members' kafka.session_timeout (a stop lasts longer); "+
		"under the consumer protocol the session is the broker's, 3s on infra/kafka.sh's")
	fs.StringVar(&o.protocol, "group-protocol", "seed", "the members' kafka.group_protocol: classic, consumer (KIP-848), or seed: "+
		"classic for an even seed, consumer for an odd one (the summary line says which ran)")
	fs.StringVar(&o.bin, "onceflow-bin", "", "the onceflow binary to run; empty: build ./cmd/onceflow of this tree")
	fs.Var(&env, "member-env", "ONCEFLOW_KEY=value for every member (repeatable); the members' other ONCEFLOW_* and OTEL_* variables are removed")
	fs.StringVar(&o.out, "out", "chaos/out", "directory for the run's directory (logs, configs, timeline, evidence)")
	fs.BoolVar(&o.keep, "keep-services", false, "leave the chaos broker and Postgres cluster running at the end")
	fs.IntVar(&o.kafkaPort, "kafka-port", 29092, "the chaos broker's port (never the shared 19092); the members' HTTP ports start 208 above it")
	fs.IntVar(&o.ctrlPort, "kafka-controller-port", 29093, "the chaos broker's controller port")
	fs.StringVar(&o.kafkaDir, "kafka-dir", filepath.Join(os.TempDir(), "onceflow-chaos-kafka"), "the chaos broker's state directory")
	fs.IntVar(&o.pgPort, "pg-port", 5442, "the chaos Postgres cluster's port (never the shared 5432)")
	fs.IntVar(&o.proxyPort, "proxy-port", 5443, "the port of the proxy in front of Postgres, which the members use")
	fs.StringVar(&o.format, "format", formatSeed, "the records' format: json; avro or protobuf (framed for the run's own schema registry, with framed poison and registry restarts); "+
		"or seed: json for an even seed, for an odd one avro or protobuf by the seed's second bit")
	fs.IntVar(&o.registryPort, "registry-port", 28081, "with -format avro or protobuf: the chaos schema registry's port (never the shared 18081)")
	fs.StringVar(&o.registryDir, "registry-dir", filepath.Join(os.TempDir(), "onceflow-chaos-schema-registry"), "with -format avro or protobuf: the chaos schema registry's state directory")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.short {
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("duration", func() { o.duration = 75 * time.Second })
		def("gap", func() { o.gap = 3 * time.Second })
		def("settle", func() { o.settle = 60 * time.Second })
		def("min-kills", func() { o.minKills = 0 })
		def("events", func() { o.events = 12000 })
		def("backlog", func() { o.backlog = 0.5 }) // ~1300 records a partition: over the 1000 a queue holds
		def("partitions", func() { o.partitions = 6 })
		def("poison-scale", func() { o.poisonScale = 1 })
	}
	if o.seed == 0 {
		o.seed = rand.Uint64N(1<<53) + 1 // printable exactly in JSON and by humans
	}
	o.memberEnv = env
	var ps []error
	var err error
	if o.protocol, err = pickProtocol(o.protocol, o.seed); err != nil {
		ps = append(ps, fmt.Errorf("-group-protocol: %w", err))
	}
	if o.faults, err = parseFaults(faults); err != nil {
		ps = append(ps, fmt.Errorf("-faults: %w", err))
	}
	if o.poison, err = parsePoison(poison); err != nil {
		ps = append(ps, fmt.Errorf("-poison: %w", err))
	}
	if !(o.backlog >= 0 && o.backlog < 1) { // NaN too
		ps = append(ps, fmt.Errorf("-backlog %v: a share, at least 0 and under 1", o.backlog))
	}
	if o.events < 1 || o.partitions < 1 || o.members < 1 || o.batch < 1 || o.poisonScale < 0 {
		ps = append(ps, errors.New("-events, -partitions, -members and -batch must be at least 1, -poison-scale at least 0"))
	}
	if o.duration < 10*time.Second || o.gap < 100*time.Millisecond || o.settle < 10*time.Second {
		ps = append(ps, errors.New("-duration and -settle must be at least 10s, -gap at least 100ms"))
	}
	if o.format, err = resolveFormat(o.format, o.seed); err != nil {
		ps = append(ps, fmt.Errorf("-format %w", err))
	}
	if o.registryPort == 18081 {
		ps = append(ps, errors.New("-registry-port 18081 is the shared schema registry: the chaos run crashes its own"))
	}
	if o.kafkaPort == 19092 || o.pgPort == 5432 {
		ps = append(ps, errors.New("-kafka-port 19092 and -pg-port 5432 are the shared services: the chaos run crashes its own"))
	}
	if o.bin != "" {
		if abs, err := filepath.Abs(o.bin); err == nil {
			o.bin = abs
		}
		if st, err := os.Stat(o.bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			ps = append(ps, fmt.Errorf("-onceflow-bin %s: not an executable file", o.bin))
		}
	}
	return o, errors.Join(ps...)
}

// pickProtocol returns the group protocol flag asks for: classic or
// consumer as named, or by the seed's sixth bit when flag is "seed" (the
// format takes the low bits: resolveFormat), so that runs with new seeds
// try every protocol with every format and a seed always replays with the
// same.
func pickProtocol(flag string, seed uint64) (string, error) {
	switch flag {
	case "classic", "consumer":
		return flag, nil
	case "seed":
		if seed>>5%2 == 0 {
			return "classic", nil
		}
		return "consumer", nil
	}
	return "", fmt.Errorf("%q: classic, consumer or seed", flag)
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(exitPass)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(exitSetup)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
	}
	os.Exit(code)
}
