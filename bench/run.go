package bench

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// Scenario names, and the baselines'.
const (
	Steady      = "steady"
	Storm       = "storm"
	Replay      = "replay"
	EffectsOnly = "effects-only"
	RawCopy     = "raw-copy"
)

// Config configures Run. Zero values take the defaults noted.
type Config struct {
	// Pool is the user's database (required). Run creates its schemas
	// through it and reads the user's tables' definitions; it writes no
	// table of the user's. Run does not close it.
	Pool *pgxpool.Pool
	// Handlers builds the handlers for a schema (required): Go handlers
	// write their tables there, SQL handlers resolve their tables on the
	// search_path, which Run begins with that schema. They must consume
	// Topic (a SQL handler with topics of its own would skip the stream).
	Handlers func(schema string) ([]sink.Handler, error)
	// Migrate creates the Go handlers' tables in a schema; nil when there
	// are only SQL handlers.
	Migrate migrate.Func
	// Consumer and Writer tune the members, as pipeline.Config's do
	// (batching, decoding, Parse...); their own fields (brokers, topics,
	// group, schema, handlers, logger) are Run's.
	Consumer processor.Config
	Writer   sink.Config
	// LRUSize of each member's dedup cache, as pipeline.Config.LRUSize
	// (negative disables it); PoolSize is the connections of the
	// benchmark's pool, shared by the members and by the baselines'
	// writers (default 4).
	LRUSize  int
	PoolSize int
	// BaselineWriters is how many writers effects-only and raw-copy write
	// with at once; 0: the fastest of PoolSize, its half, its quarter, …,
	// 1, each timed over the first CalibrationEvents events before the
	// rounds (one writer per connection at most: it is at most PoolSize).
	// Handlers that update a few hot rows make concurrent writers wait on
	// one another, and a baseline must be the fastest writer of the
	// effects, not one slowed by its own contention.
	BaselineWriters int

	// Brokers: a real Kafka, where Run creates a topic of its own and
	// deletes it at the end (never a topic of the configuration); empty:
	// an embedded kfake cluster. KafkaOptions are the clients' security
	// options for Brokers.
	Brokers      []string
	KafkaOptions []kgo.Opt
	// Topic is the topic the stream stands for (required): the embedded
	// cluster's topic is so named; with Brokers, the topic is
	// Topic-bench-<random>, and the handlers still see Topic as their
	// events' topic (events.topic, Event.Topic, TopicFilter.Consumes).
	Topic string

	Payloads   *Payloads // required
	Events     int       // unique events per run; default 100000
	Duplicates float64   // redeliveries per event, 0 to 1
	// OtherPartition is the share of the redeliveries on another
	// partition than their event's first delivery, 0 to 1; nil:
	// DefaultOtherPartition.
	OtherPartition *float64
	Partitions     int      // default 12
	Members        int      // group members at once; default 3
	Scenarios      []string // of Steady, Storm, Replay; default all three
	Rounds         int      // each run this many times, the median reported (of an even number, the lower middle); default 1
	// StormChanges is how many membership changes a storm makes: a
	// member joins, the oldest leaves, and every third change kills the
	// oldest (as a SIGKILL would: it never leaves the group, and its
	// partitions wait for the session timeout) and starts a replacement.
	// With StormEvery 0 they are spread over the stream: change k once
	// k/(StormChanges+1) of its records are committed, and never sooner
	// than half a second (two of the run's 250 ms samples) after change
	// k-1 returned, so that changes do not bunch where a sample sees
	// several shares at once. No change is made once the stream has
	// been consumed (the group's stored offsets, read just before it):
	// the changes left are not made, and the run says so
	// (RunResult.StormShort; "N of M changes made before the stream
	// ended"). A stream too short for its changes needs more Events.
	// Default 12.
	StormChanges int
	// StormEvery, when set, paces the storm by time instead: a change
	// every StormEvery from the group's first commit on (a change due
	// while another runs starts when that one returns), the same way
	// never after the stream has been consumed.
	StormEvery time.Duration
	// GroupProtocols: the scenarios run under each of these group
	// protocols in turn, round by round, side by side in one Results
	// (the runs named steady-classic, storm-consumer...; Results.Protocols
	// compares them). Default: Consumer.GroupProtocol's alone.
	GroupProtocols []processor.GroupProtocol
	// InstanceID makes the storm's members static (KIP-345: instance ids
	// onceflow-bench-member-N), and a storm's kill a restart: the member
	// is killed and started again under its id at once; each restart
	// counts the partitions the member ran and how many of them another
	// member ran before the restart took them back (RunResult.StaticMoved:
	// 0 is static membership working). Consumer.InstanceID is not used.
	InstanceID bool
	// Formats: besides JSON, the scenarios run again with the payloads in
	// each of these formats (avro, protobuf), after JSON's runs in every
	// round, named steady-avro, storm-protobuf...; the baselines stay
	// JSON. Results.Formats compares each with JSON's runs. Each format's
	// stream is on an embedded cluster of its own (not with Brokers, nor
	// with several GroupProtocols); Consumer.Decode.Format must be json.
	Formats []Format
	// Checkpoint runs CHECKPOINT before each run (baselines included), so
	// that runs writing the same WAL meet the server's checkpoints at the
	// same places; a role that may not (it needs pg_checkpoint or
	// superuser) is said once, and its runs are "not from one". The
	// checkpoints the server begins during each run are counted either
	// way (RunResult.Checkpoints).
	Checkpoint bool
	// CPUProfile, if set, receives a CPU profile (runtime/pprof) of this
	// process during round 1's run of CPUProfileOf: a scenario (under
	// the first of GroupProtocols) or a baseline; default steady.
	CPUProfile   io.Writer
	CPUProfileOf string
	Seed         uint64
	// Schema prefixes the schemas of the runs
	// (<Schema>_<random>_<run>_r<round>, the random part the same for
	// every run of one call); default "onceflow_bench". Keep leaves them
	// after the run.
	Schema string
	Keep   bool
	// DropLeftovers drops, at the start, the schemas (and with Brokers
	// the topics) that earlier runs with this Schema and Topic left and
	// no running bench holds (FindLeftovers); without it they are listed
	// on Progress with the commands that drop them.
	DropLeftovers bool
	// NoRawCopy skips the raw-copy baseline; effects-only always runs
	// (it is the reference the runs' tables are checked against).
	NoRawCopy bool

	Progress io.Writer    // the progress lines; nil discards
	Logger   *slog.Logger // the members' logs; nil discards
}

func (c Config) withDefaults() Config {
	if c.Events == 0 {
		c.Events = 100000
	}
	if c.Partitions == 0 {
		c.Partitions = 12
	}
	if c.Members == 0 {
		c.Members = 3
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = []string{Steady, Storm, Replay}
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.StormChanges == 0 {
		c.StormChanges = 12
	}
	if len(c.GroupProtocols) == 0 {
		c.GroupProtocols = []processor.GroupProtocol{cmp.Or(c.Consumer.GroupProtocol, processor.DefaultGroupProtocol)}
	}
	if c.CPUProfileOf == "" {
		c.CPUProfileOf = Steady
	}
	if c.Schema == "" {
		c.Schema = "onceflow_bench"
	}
	if c.PoolSize == 0 {
		c.PoolSize = 4
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Logger = slog.New(guardQuiet{c.Logger.Handler()})
	return c
}

// ConfigError is one problem of a Config: Field is the Config field's
// name (Duplicates, StormEvery...), Value its value as given, Problem
// what is wrong with it (with no Value, a sentence naming the field).
// `onceflow bench` says Field by its flag (--duplicates 5: a share from
// 0 to 1).
type ConfigError struct {
	Field   string
	Value   string
	Problem string
}

func (e *ConfigError) Error() string {
	if e.Value == "" { // the Problem names the field
		return "bench: " + e.Problem
	}
	return "bench: " + e.Field + " " + e.Value + ": " + e.Problem
}

// Problems are the problems err joins (errors.Join, as Validate returns
// them), each alone; err itself when it joins none; nil for nil.
func Problems(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Problems(e)...)
		}
		return out
	}
	return []error{err}
}

// Validate returns every problem with c (after defaults) at once, joined
// (Problems splits them), each a *ConfigError naming its field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var ps []error
	bad := func(field string, value any, format string, a ...any) {
		v := ""
		if value != nil {
			v = fmt.Sprint(value)
		}
		ps = append(ps, &ConfigError{Field: field, Value: v, Problem: fmt.Sprintf(format, a...)})
	}
	if c.Pool == nil {
		bad("Pool", nil, "no Pool: the user's database is required")
	}
	if c.Handlers == nil {
		bad("Handlers", nil, "no Handlers")
	}
	if c.Payloads == nil {
		bad("Payloads", nil, "no Payloads: a sample or a template")
	}
	if c.Topic == "" {
		bad("Topic", nil, "no Topic: the topic the stream stands for")
	}
	if c.Events < 1 {
		bad("Events", c.Events, "at least 1")
	}
	if o := otherPartition(c.OtherPartition); !(o >= 0 && o <= 1) { // NaN too
		bad("OtherPartition", o, "a share from 0 to 1")
	}
	if !(c.Duplicates >= 0 && c.Duplicates <= 1) { // NaN too
		bad("Duplicates", c.Duplicates, "a share from 0 to 1")
	} else if n := float64(c.Events) * (1 + c.Duplicates); c.Events >= 1 && n > MaxRecords {
		bad("Events", c.Events, "with Duplicates %g, %.0f records: at most %d records, since the stream is held in memory for the whole run "+
			"(about %d bytes a record besides its payload, and the embedded kfake holds the topic too)", c.Duplicates, n, MaxRecords, RecordBytes)
	}
	if c.Partitions < 1 {
		bad("Partitions", c.Partitions, "at least 1")
	} else if c.Partitions > MaxPartitions {
		bad("Partitions", c.Partitions, "at most %d: each member runs a worker per partition it holds, "+
			"and a group on the embedded kfake never became ready with 100000", MaxPartitions)
	}
	if c.Members < 1 {
		bad("Members", c.Members, "at least 1")
	}
	if c.Rounds < 1 {
		bad("Rounds", c.Rounds, "at least 1")
	}
	if c.PoolSize < 1 {
		bad("PoolSize", c.PoolSize, "at least 1")
	}
	if c.BaselineWriters < 0 || c.BaselineWriters > max(c.PoolSize, 1) {
		bad("BaselineWriters", c.BaselineWriters, "at most one writer per connection of the pool (%d); left unset, the fastest is measured", c.PoolSize)
	}
	if c.StormChanges < 1 {
		bad("StormChanges", c.StormChanges, "at least 1")
	}
	if c.StormEvery < 0 {
		bad("StormEvery", c.StormEvery, "not negative")
	}
	for i, p := range c.GroupProtocols {
		if p != processor.ClassicProtocol && p != processor.ConsumerProtocol {
			bad("GroupProtocols", fmt.Sprintf("%q", p), "%s or %s", processor.ClassicProtocol, processor.ConsumerProtocol)
		} else if slices.Contains(c.GroupProtocols[:i], p) {
			bad("GroupProtocols", fmt.Sprintf("%q", p), "listed twice")
		}
	}
	if c.InstanceID && len(c.Brokers) == 0 && slices.Contains(c.GroupProtocols, processor.ConsumerProtocol) && slices.Contains(c.Scenarios, Storm) {
		// kfake stops a static member's session timer when it leaves for
		// now (epoch -2): its partitions stay reserved for it forever, and
		// a storm whose static member left never ends. Kafka expires it.
		bad("InstanceID", nil, "InstanceID with the consumer group protocol needs a real Kafka (Brokers): "+
			"the embedded kfake never expires a static member that left, and the storm would wait for its partitions forever")
	}
	for i, f := range c.Formats {
		switch {
		case f.Name != processor.FormatAvro && f.Name != processor.FormatProtobuf:
			bad("Formats", fmt.Sprintf("%q", f.Name), "avro or protobuf (JSON's runs are always made)")
		case f.Encoder == nil || f.Decoder == nil:
			bad("Formats", f.Name, "an Encoder and a Decoder are required")
		case slices.ContainsFunc(c.Formats[:i], func(g Format) bool { return g.Name == f.Name }):
			bad("Formats", f.Name, "listed twice")
		}
	}
	if len(c.Formats) > 0 {
		if len(c.Brokers) > 0 {
			bad("Formats", nil, "Formats with Brokers: the formats' streams run on the embedded kfake only")
		}
		if len(c.GroupProtocols) > 1 {
			bad("Formats", nil, "Formats with several GroupProtocols: compare formats under one protocol, or protocols in one format")
		}
		if d := c.Consumer.Decode.Format; d != "" && d != processor.FormatJSON {
			bad("Formats", nil, "Formats with decode.format %s: the formats are compared with JSON's runs", d)
		}
	}
	// The profiled run's name is checked whether or not a profile is
	// asked for: a misspelt one is a mistake either way.
	if of := c.CPUProfileOf; !slices.Contains([]string{Steady, Storm, Replay, EffectsOnly, RawCopy}, of) {
		bad("CPUProfileOf", fmt.Sprintf("%q", of), "a scenario (steady, storm, replay) or a baseline (effects-only, raw-copy)")
	} else if c.CPUProfile != nil && of != EffectsOnly && of != RawCopy && !slices.Contains(c.Scenarios, of) {
		bad("CPUProfileOf", fmt.Sprintf("%q", of), "not among the scenarios run (%s)", strings.Join(c.Scenarios, ", "))
	} else if c.CPUProfile != nil && of == RawCopy && c.NoRawCopy {
		bad("CPUProfileOf", "raw-copy", "with NoRawCopy: nothing to profile")
	}
	for i, s := range c.Scenarios {
		if !slices.Contains([]string{Steady, Storm, Replay}, s) {
			bad("Scenarios", fmt.Sprintf("%q", s), "unknown scenario %q (steady, storm, replay)", s)
		}
		if slices.Contains(c.Scenarios[:i], s) {
			bad("Scenarios", fmt.Sprintf("%q", s), "scenario %q listed twice (Rounds repeats runs)", s)
		}
	}
	if !validSchemaPrefix(c.Schema) {
		bad("Schema", fmt.Sprintf("%q", c.Schema), "lower-case letters, digits and _ only, starting with a letter, at most 30, not pg_ (Postgres keeps it for its own schemas)")
	}
	d := c.Consumer.Decode
	switch {
	case d.Format != "" && d.Format != processor.FormatJSON && d.Format != processor.FormatBytes:
		bad("Consumer.Decode.Format", d.Format, "bench generates JSON payloads (json or bytes)")
	case d.IDSource == processor.IDFromOffset:
		bad("Consumer.Decode.IDSource", "offset", "a redelivery at another offset would be another event; bench needs ids it can redeliver (header, field or key)")
	case (d.IDSource == processor.IDFromField || (d.IDSource == "" && d.IDField != "")) && d.Format == processor.FormatBytes:
		bad("Consumer.Decode.IDSource", "field", "needs decode.format json")
	}
	return errors.Join(ps...)
}

// MaxRecords bounds a stream's records (Events × (1 + Duplicates)): the
// stream is generated before the runs and held in memory until the last,
// each record about RecordBytes besides its payload (its Kafka record,
// and each event's for the baselines), and the embedded kfake holds a
// copy of the topic: 10 million records are some 6 GB.
const MaxRecords = 10_000_000

// RecordBytes is about what a generated record takes in memory besides
// its payload (measured: 540 to 580 bytes with 30 % redeliveries).
const RecordBytes = 550

// MaxPartitions bounds Partitions: a group on the embedded kfake never
// became ready with 100 000 (bench waited for the brokers), and a
// benchmark's few members each run a worker per partition they hold;
// 1000 is far above what a topic of a few members needs.
const MaxPartitions = 1000

// validSchemaPrefix: a name Postgres takes for a schema unquoted, that
// leaves room for _<random>_<run>_r<round>_t in its 63 bytes; not pg_,
// which Postgres keeps for its own schemas.
func validSchemaPrefix(s string) bool {
	if s == "" || len(s) > 30 || s[0] < 'a' || s[0] > 'z' || strings.HasPrefix(s, "pg_") {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// record is one generated record as produced, and the event it carries
// as the baselines give it to the handlers.
type streamRecords struct {
	recs   []*kgo.Record // in production order
	events []sink.Event  // the unique events, for the baselines
	first  []int         // per event, its first delivery's index in recs
}

// produced sets each event's Offset to its first delivery's, once recs
// are produced (the client set their offsets).
func (s *streamRecords) produced() {
	for e, i := range s.first {
		s.events[e].Offset = s.recs[i].Offset
	}
}

// records makes the Kafka records of s for topic: the id where the
// decoder reads it (header, key or a top-level field of the JSON value),
// the event's timestamp, the record's partition.
func records(s *Stream, topic string, d processor.DecodeConfig) (*streamRecords, error) {
	src := d.IDSource
	if src == "" {
		src = processor.IDFromHeader
		if d.IDField != "" {
			src = processor.IDFromField
		}
	}
	header := d.IDHeader
	if header == "" {
		header = processor.HeaderEventID
	}
	out := &streamRecords{events: make([]sink.Event, len(s.Events)), first: make([]int, len(s.Events))}
	values := make([][]byte, len(s.Events))
	for i, e := range s.Events {
		v := e.Value
		if src == processor.IDFromField {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(v, &m); err != nil || m == nil {
				return nil, fmt.Errorf("decode.event_id_field %s: payload %d is not a JSON object, so bench cannot put the id in it", d.IDField, i+1)
			}
			m[d.IDField], _ = json.Marshal(e.ID.String())
			v, _ = json.Marshal(m)
		}
		values[i] = v
		ev := sink.Event{ID: e.ID, Value: v, Topic: topic, Partition: e.Partition, Offset: -1, Timestamp: e.Timestamp}
		switch src {
		case processor.IDFromHeader:
			ev.Headers = []sink.Header{{Key: header, Value: []byte(e.ID.String())}}
		case processor.IDFromKey:
			ev.Key = []byte(e.ID.String())
		}
		out.events[i] = ev
	}
	for i, r := range s.Records {
		if !r.Redelivery {
			out.first[r.Event] = i
		}
		ev := out.events[r.Event]
		rec := &kgo.Record{Topic: topic, Partition: r.Partition, Value: values[r.Event], Key: ev.Key, Timestamp: ev.Timestamp}
		for _, h := range ev.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		out.recs = append(out.recs, rec)
	}
	return out, nil
}

// uniqueIDs is the set of the stream's ids (for checks).
func uniqueIDs(evs []sink.Event) map[uuid.UUID]bool {
	m := make(map[uuid.UUID]bool, len(evs))
	for _, e := range evs {
		m[e.ID] = true
	}
	return m
}

// progressLine is the progress of a run: on a terminal, one line
// rewritten in place; elsewhere (a file, a pipe, a CI log), a line every
// 5 seconds and the last.
type progressLine struct {
	mu   sync.Mutex
	w    io.Writer
	tty  bool
	n    int       // length of the last line, on a terminal
	last time.Time // of the last line written, elsewhere
}

func newProgressLine(w io.Writer) *progressLine {
	p := &progressLine{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progressLine) set(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.write(false, format, a...)
}

func (p *progressLine) write(final bool, format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	if !p.tty {
		if final || time.Since(p.last) >= 5*time.Second {
			fmt.Fprintln(p.w, s)
			p.last = time.Now()
		}
		return
	}
	pad := ""
	if len(s) < p.n {
		pad = strings.Repeat(" ", p.n-len(s))
	}
	fmt.Fprintf(p.w, "\r%s%s", s, pad)
	p.n = len(s)
	if final {
		fmt.Fprintln(p.w)
		p.n = 0
	}
}

// done writes the run's last line.
func (p *progressLine) done(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.write(true, format, a...)
	p.last = time.Time{}
}
