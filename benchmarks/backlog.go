package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/wire"
)

// backlogOptions are the flags of `benchmarks backlog`.
type backlogOptions struct {
	options            // brokers, dsn, duplicates, partitions, handlers, seed, out (shared meaning)
	records     int    // records in the backlog, redeliveries included
	prefill     int64  // processed_events rows before the run
	ids         string // v4 | v7
	fillfactor  int    // of the pre-filled event_id indexes; 0: as grown by such ids
	older       bool   // the pre-fill is an older dedup slice; the run claims into a new one
	warm        bool   // read the pre-fill's indexes into shared_buffers before the run
	compression string // the producer's
	batchBytes  int    // the producer's batch size
	bin         string // a built onceflow; empty: go build ./cmd/onceflow
	memberEnv   []string
	rawCopy     bool
	rawEvents   int
	spans       int
	sampleEvery time.Duration
	timeout     time.Duration
	keep        bool
	reference   string // an earlier run's results.json to compare with
}

func parseBacklogFlags(args []string) (backlogOptions, error) {
	var o backlogOptions
	fs := flag.NewFlagSet("backlog", flag.ContinueOnError)
	var handlers string
	fs.StringVar(&o.brokers, "brokers", "", "a real Kafka's brokers (host:port,...); empty: an embedded kfake cluster (small runs only: it holds the topic in memory)")
	fs.StringVar(&o.dsn, "dsn", envOr("ONCEFLOW_POSTGRES_DSN", "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow?sslmode=disable"), "Postgres")
	fs.IntVar(&o.records, "records", 1000000, "records in the backlog, redeliveries included")
	fs.Float64Var(&o.duplicates, "duplicates", 0.3, "redeliveries per unique event")
	fs.IntVar(&o.partitions, "partitions", 12, "partitions of the topic")
	fs.StringVar(&handlers, "handlers", orders.Email, "comma-separated handlers (the member's handlers key)")
	fs.Int64Var(&o.prefill, "prefill", 0, "processed_events rows (and one emails_sent row per event) written before the run")
	fs.BoolVar(&o.older, "prefill-older", false, "make the pre-fill an older dedup slice (as dedup.retention_slices > 1 leaves it): the run claims into a new, empty slice and probes the pre-fill; false: the pre-fill is the slice the run claims into")
	fs.BoolVar(&o.warm, "prefill-warm", true, "read the pre-fill's indexes (the dedup slice's key, emails_sent's event_id) into shared_buffers before the run, as a pipeline that has run a while has them cached; false: start cold")
	fs.StringVar(&o.ids, "ids", "v4", "event ids of the pre-fill and the backlog: v4 (random) or v7 (time-ordered)")
	fs.IntVar(&o.fillfactor, "prefill-fillfactor", 0, "fillfactor the pre-filled event_id indexes are built with; 0: as an index grown by such ids is (70 for v4, 90 for v7)")
	fs.StringVar(&o.compression, "compression", "snappy", "the producer's batch compression: none, snappy, lz4 or zstd")
	fs.IntVar(&o.batchBytes, "produce-batch-bytes", 1<<20, "the producer's largest batch (franz-go's default; Java's batch.size is 16384): a queued record keeps its whole batch in the member's memory")
	fs.StringVar(&o.bin, "bin", "", "the onceflow binary to run; empty: go build ./cmd/onceflow into -out")
	fs.Func("member-env", "KEY=VALUE added to the member's environment (repeatable), e.g. GOMEMLIMIT=180MiB or ONCEFLOW_KAFKA_FETCH_MAX_BYTES=4194304", func(s string) error {
		if !strings.Contains(s, "=") {
			return fmt.Errorf("%q is not KEY=VALUE", s)
		}
		o.memberEnv = append(o.memberEnv, s)
		return nil
	})
	fs.BoolVar(&o.rawCopy, "raw-copy", true, "after the member, write fresh events by raw COPY into the same tables, for the ratio")
	fs.IntVar(&o.rawEvents, "raw-events", 0, "unique events of the raw copy; 0: as many as the backlog has")
	fs.IntVar(&o.spans, "spans", 10, "spans of equal table growth in the rate-by-size table")
	fs.DurationVar(&o.sampleEvery, "sample", time.Second, "sampling interval")
	fs.DurationVar(&o.timeout, "timeout", 4*time.Hour, "give up when the backlog is not committed by then")
	fs.StringVar(&o.reference, "reference", "", "results.json of an earlier backlog run (e.g. -prefill 0) whose median span rate this run's is compared with")
	fs.BoolVar(&o.keep, "keep", false, "keep the schema and the topic (to look at them after)")
	fs.StringVar(&o.out, "out", "benchmarks/out/backlog", "output directory")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the generated events")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.handlers = strings.Split(handlers, ",")
	o.poolSize, o.batch = 4, 1000 // the raw copy's connections and batch, as in the main benchmark
	var ps []error
	if o.records < 1 {
		ps = append(ps, errors.New("-records must be at least 1"))
	}
	if o.prefill < 0 || o.rawEvents < 0 || o.duplicates < 0 {
		ps = append(ps, errors.New("-prefill, -raw-events and -duplicates must not be negative"))
	}
	if o.fillfactor != 0 && (o.fillfactor < 10 || o.fillfactor > 100) {
		ps = append(ps, fmt.Errorf("-prefill-fillfactor: %d is not 10..100 (0: by ids)", o.fillfactor))
	}
	if o.batchBytes < 1024 {
		ps = append(ps, fmt.Errorf("-produce-batch-bytes: %d is below 1024", o.batchBytes))
	}
	if o.partitions < 1 || o.spans < 1 || o.sampleEvery <= 0 {
		ps = append(ps, errors.New("-partitions, -spans and -sample must be positive"))
	}
	if o.ids != "v4" && o.ids != "v7" {
		ps = append(ps, fmt.Errorf("-ids: %q is not v4 or v7", o.ids))
	}
	if _, ok := compressions[o.compression]; !ok {
		ps = append(ps, fmt.Errorf("-compression: %q is not none, snappy, lz4 or zstd", o.compression))
	}
	if _, err := orders.Handlers("public", o.handlers...); err != nil {
		ps = append(ps, fmt.Errorf("-handlers: %w", err))
	}
	return o, errors.Join(ps...)
}

var compressions = map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "snappy": kgo.SnappyCompression(),
	"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression()}

// BacklogReport is the backlog run's results.json.
type BacklogReport struct {
	Command      string            `json:"command"`
	Build        string            `json:"build"` // see build
	Machine      string            `json:"machine"`
	Broker       string            `json:"broker"`
	Handlers     []string          `json:"handlers"`
	Partitions   int               `json:"partitions"`
	StartedAt    time.Time         `json:"started_at"`
	Postgres     map[string]string `json:"postgres"` // the settings the figures depend on
	MemberEnv    []string          `json:"member_env"`
	Prefill      Prefill           `json:"prefill"`
	Records      int               `json:"records"`
	UniqueEvents int               `json:"unique_events"`
	ProduceSecs  float64           `json:"produce_seconds"`
	Seconds      float64           `json:"seconds"` // from the member's start to the last record committed
	// EventsPerSec and RecordsPerSec are over the whole run, start-up included.
	EventsPerSec  float64    `json:"events_per_sec"`
	RecordsPerSec float64    `json:"records_per_sec"`
	PeakRSSMiB    float64    `json:"peak_rss_mib"` // the member's VmHWM once the backlog is committed
	MaxSampledRSS float64    `json:"max_sampled_rss_mib"`
	ExactlyOnce   bool       `json:"exactly_once"`
	Problems      []string   `json:"problems"`
	BySize        []SizeRate `json:"by_size"`
	HoldRatio     float64    `json:"hold_ratio"` // last span's events/s over the first's
	RawCopy       *RawCopy   `json:"raw_copy,omitempty"`
	// RatioRawCopy is the member's median span rate over the raw copy's,
	// which writes on top of the tables the member left.
	RatioRawCopy float64 `json:"ratio_to_raw_copy,omitempty"`
	// MedianEventsPerSec is the median of the spans' rates; Reference
	// compares it with an earlier run's (-reference).
	MedianEventsPerSec float64         `json:"median_events_per_sec"`
	Reference          *Reference      `json:"reference,omitempty"`
	Samples            []BacklogSample `json:"samples"`
}

func runBacklog(ctx context.Context, o backlogOptions) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	var ref *Reference
	if o.reference != "" { // read first: a bad path should not cost a run
		var err error
		if ref, err = readReference(o.reference); err != nil {
			return fmt.Errorf("-reference: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	binDir, err := os.MkdirTemp("", "onceflow-backlog-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	bin, err := buildBinary(ctx, binDir, o.bin)
	if err != nil {
		return err
	}
	e, err := newEnv(ctx, o.options, "backlog")
	if err != nil {
		return fmt.Errorf("postgres or kafka (start them with infra/postgres.sh start, infra/kafka.sh start): %w", err)
	}
	if o.keep {
		progress("keeping schema %s and topic %s (-keep)", e.schema, e.topic)
	} else {
		defer e.close()
	}
	broker := "kfake (embedded)"
	if o.brokers != "" {
		broker = "Apache Kafka at " + o.brokers
	}
	rep := &BacklogReport{Command: "go run ./benchmarks " + strings.Join(redactDSN(os.Args[1:]), " "), Build: build(o.bin), Machine: machine(), Broker: broker,
		Handlers: o.handlers, Partitions: o.partitions, StartedAt: time.Now().UTC(), MemberEnv: nonNil(o.memberEnv),
		Postgres: pgSettings(ctx, e.pool)}

	if rep.Prefill, err = prefill(ctx, e, o); err != nil {
		return err
	}
	events := int(float64(o.records)/(1+o.duplicates) + 0.5)
	stream, err := orders.Generate(events, o.duplicates, o.seed)
	if err != nil {
		return err
	}
	if o.ids == "v7" {
		if stream, err = timeOrdered(stream); err != nil {
			return err
		}
	}
	rep.Records, rep.UniqueEvents = len(stream.Messages), len(stream.Unique)
	t := time.Now()
	ends, err := produce(ctx, e, stream.Messages, compressions[o.compression], int32(o.batchBytes))
	if err != nil {
		return fmt.Errorf("produce the backlog: %w", err)
	}
	rep.ProduceSecs = time.Since(t).Seconds()
	progress("backlog: %d records (%d unique events) on %s in %.0fs", rep.Records, rep.UniqueEvents, e.topic, rep.ProduceSecs)
	stream.Messages = nil // the check needs only the events

	if err := runMember(ctx, o, rep, e, bin, ends); err != nil {
		rep.BySize = bySize(rep.Samples, len(o.handlers), o.spans)
		if werr := writeBacklog(o.out, rep); werr == nil { // the samples so far
			progress("backlog: the samples so far are in %s", filepath.Join(o.out, "results.json"))
		}
		return err
	}
	check, closeCheck, err := checkViews(ctx, e, rep.Prefill.MaxEmailID)
	if err != nil {
		return err
	}
	defer closeCheck()
	cr, err := orders.Check(ctx, e.pool, check, stream.Unique, o.handlers...)
	if err != nil {
		return err
	}
	rep.ExactlyOnce, rep.Problems = cr.ExactlyOnce(), nonNil(cr.Problems)
	progress("backlog: exactly once: %v %v", rep.ExactlyOnce, rep.Problems)

	if o.rawCopy {
		if rep.RawCopy, err = rawCopyOn(ctx, e, o, events); err != nil {
			return fmt.Errorf("raw copy: %w", err)
		}
		if rep.RawCopy.UniqueEventsPerSec > 0 {
			rep.RatioRawCopy = rep.MedianEventsPerSec / rep.RawCopy.UniqueEventsPerSec
		}
	}
	if ref != nil {
		rep.Reference = ref
		if ref.MedianEventsPerSec > 0 {
			ref.Ratio = rep.MedianEventsPerSec / ref.MedianEventsPerSec
		}
	}
	if err := writeBacklog(o.out, rep); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", strings.Join([]string{filepath.Join(o.out, "results.json"), filepath.Join(o.out, "results.md"),
		filepath.Join(o.out, "rate-by-size.png"), filepath.Join(o.out, "rss.png")}, ", "))
	if !rep.ExactlyOnce {
		return fmt.Errorf("effects NOT exactly once: %v", rep.Problems)
	}
	return nil
}

// Reference is an earlier run this one is compared with.
type Reference struct {
	Path               string  `json:"path"`
	PrefillRows        int64   `json:"prefill_rows"`
	MedianEventsPerSec float64 `json:"median_events_per_sec"`
	Ratio              float64 `json:"ratio"` // this run's median span rate over the reference's
}

// readReference reads an earlier backlog run's results.json; the caller
// sets Ratio.
func readReference(path string) (*Reference, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r BacklogReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ref := &Reference{Path: path, PrefillRows: r.Prefill.Rows, MedianEventsPerSec: medianRate(r.BySize)}
	if ref.MedianEventsPerSec == 0 {
		return nil, fmt.Errorf("%s has no span rates to compare with", path)
	}
	return ref, nil
}

// runMember runs one onceflow member on e until every record of the
// backlog is committed, sampling it every o.sampleEvery, and stops it.
// ends is the offset after each partition's last record.
func runMember(ctx context.Context, o backlogOptions, rep *BacklogReport, e *env, bin string, ends map[int32]int64) error {
	env := []string{
		"ONCEFLOW_KAFKA_BROKERS=" + strings.Join(e.brokers, ","),
		"ONCEFLOW_KAFKA_TOPICS=" + e.topic,
		"ONCEFLOW_KAFKA_GROUP=" + e.group,
		"ONCEFLOW_KAFKA_DEAD_LETTER_TOPIC=" + e.topic + ".dlq",
		"ONCEFLOW_POSTGRES_DSN=" + o.dsn,
		"ONCEFLOW_POSTGRES_SCHEMA=" + e.schema,
		"ONCEFLOW_HANDLERS=" + strings.Join(o.handlers, ","),
		"ONCEFLOW_LOG_LEVEL=warn",
	}
	m, err := startMember(bin, filepath.Join(o.out, "member.log"), env, o.memberEnv)
	if err != nil {
		return err
	}
	defer func() { _ = m.stop() }() // before e.close drops the schema
	start := time.Now()
	progress("member: pid %d, http %s, log %s", m.pid, m.addr, m.logPath)
	tick := time.NewTicker(o.sampleEvery)
	defer tick.Stop()
	// processed_events is partitioned (dedup slices): its size is its leaves'.
	sizes := `SELECT coalesce(sum(pg_relation_size(relid)), 0)::bigint, coalesce(sum(pg_indexes_size(relid)), 0)::bigint,
    pg_total_relation_size($2::regclass) FROM pg_partition_tree($1::regclass) WHERE isleaf`
	processed := pgx.Identifier{e.schema, "processed_events"}.Sanitize()
	emails := pgx.Identifier{e.schema, "emails_sent"}.Sanitize()
	lastLog := time.Now()
	rep.Samples = append(rep.Samples, BacklogSample{DedupRows: rep.Prefill.Rows})
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("backlog not committed: %w", ctx.Err())
		case <-m.exited:
			return fmt.Errorf("member exited before the backlog was committed (%v):\n%s", m.err, m.logTail())
		case <-tick.C:
		}
		s := BacklogSample{T: time.Since(start).Seconds(), RSSMiB: m.status("VmRSS")}
		applied, consumed, ok := m.counters(ctx)
		if !ok && len(rep.Samples) > 1 {
			continue // not answering for a moment: skip rather than record a drop to zero
		}
		s.Applied, s.Consumed = applied, consumed
		s.DedupRows = rep.Prefill.Rows + applied
		next, err := members.StoredOffsets(ctx, e.pool, e.schema, e.group, e.topic, "")
		if err != nil {
			return err
		}
		for _, n := range next {
			s.Committed += n
		}
		s.PartitionsDone = partitionsDone(next, ends)
		if err := e.pool.QueryRow(ctx, sizes, processed, emails).Scan(&s.TableBytes, &s.IndexBytes, &s.BusinessBytes); err != nil {
			return fmt.Errorf("table sizes: %w", err)
		}
		rep.Samples = append(rep.Samples, s)
		rep.MaxSampledRSS = max(rep.MaxSampledRSS, s.RSSMiB)
		if time.Since(lastLog) >= 10*time.Second {
			progress("member: %5.0fs committed %d/%d records, dedup rows %d, table+index %.0f MiB, RSS %.0f MiB",
				s.T, s.Committed, rep.Records, s.DedupRows, float64(s.TableBytes+s.IndexBytes)/(1<<20), s.RSSMiB)
			lastLog = time.Now()
		}
		if s.Committed >= int64(rep.Records) {
			break
		}
	}
	rep.Seconds = rep.Samples[len(rep.Samples)-1].T
	rep.PeakRSSMiB = m.status("VmHWM") // before it stops: the drain is not part of the run
	rep.EventsPerSec = float64(rep.UniqueEvents) / rep.Seconds
	rep.RecordsPerSec = float64(rep.Records) / rep.Seconds
	rep.BySize = bySize(rep.Samples, len(o.handlers), o.spans)
	rep.HoldRatio = holdRatio(rep.BySize)
	rep.MedianEventsPerSec = medianRate(rep.BySize)
	if err := m.stop(); err != nil {
		return fmt.Errorf("member did not stop cleanly (%v):\n%s", err, m.logTail())
	}
	progress("member: %d records in %.0fs = %.0f events/s; peak RSS %.0f MiB", rep.Records, rep.Seconds, rep.EventsPerSec, rep.PeakRSSMiB)
	return nil
}

// produce publishes msgs to e's topic in batches of up to batchBytes, as
// fast as the client batches them, and returns the offset after each
// partition's last record.
func produce(ctx context.Context, e *env, msgs []orders.Message, codec kgo.CompressionCodec, batchBytes int32) (map[int32]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic),
		kgo.ProducerLinger(10*time.Millisecond), kgo.ProducerBatchMaxBytes(batchBytes), kgo.MaxBufferedRecords(1<<16),
		kgo.ProducerBatchCompression(codec))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var mu sync.Mutex
	var first error
	ends := map[int32]int64{}
	for i, m := range msgs {
		cl.Produce(ctx, wire.NewRecord(e.topic, m.ID, m.Value), func(r *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			if err == nil {
				ends[r.Partition] = max(ends[r.Partition], r.Offset+1)
			}
		})
		if (i+1)%1_000_000 == 0 {
			progress("backlog: %d/%d records produced", i+1, len(msgs))
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return ends, first
}

// checkViews creates a schema of views over e's tables that leave out the
// pre-filled rows and the raw copy's (processed_events by bus,
// emails_sent by id), so that orders.Check sees the run's rows only. The
// caller calls closeFn.
func checkViews(ctx context.Context, e *env, maxEmailID int64) (schema string, closeFn func(), err error) {
	schema = e.schema + "_check"
	q := func(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }
	v := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	stmts := []string{
		`CREATE SCHEMA ` + pgx.Identifier{schema}.Sanitize(),
		`CREATE VIEW ` + v("processed_events") + ` AS SELECT * FROM ` + q("processed_events") + ` WHERE bus NOT IN ('` + prefillBus + `', '` + rawCopyBus + `')`,
		fmt.Sprintf(`CREATE VIEW %s AS SELECT * FROM %s WHERE id > %d`, v("emails_sent"), q("emails_sent"), maxEmailID),
	}
	for _, t := range []string{"analytics_counters", "inventory_reserved", "recommender_weights"} {
		stmts = append(stmts, `CREATE VIEW `+v(t)+` AS SELECT * FROM `+q(t))
	}
	closeFn = func() {
		_, _ = e.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	}
	for _, s := range stmts {
		if _, err := e.pool.Exec(ctx, s); err != nil {
			closeFn()
			return "", nil, fmt.Errorf("check views: %w", err)
		}
	}
	return schema, closeFn, nil
}

// rawCopyBus marks the raw copy's processed_events rows in a backlog run.
const rawCopyBus = "raw-copy"

// rawCopyCheck checks the raw copy's own rows in tables it shares: one
// processed_events row per event and handler, one email per event.
func rawCopyCheck(ctx context.Context, pool *pgxpool.Pool, schema string, maxEmailID int64, events int, handlers []string) (orders.Report, error) {
	rep := orders.Report{UniqueEvents: events, ProcessedRows: map[string]int64{}}
	rows, err := pool.Query(ctx, `SELECT handler, count(*) FROM `+pgx.Identifier{schema, "processed_events"}.Sanitize()+
		` WHERE bus = $1 GROUP BY handler`, rawCopyBus)
	if err != nil {
		return rep, err
	}
	var h string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&h, &n}, func() error { rep.ProcessedRows[h] = n; return nil }); err != nil {
		return rep, err
	}
	for _, h := range handlers {
		if rep.ProcessedRows[h] != int64(events) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("processed_events: %d raw-copy rows for %s, want %d", rep.ProcessedRows[h], h, events))
		}
	}
	if slices.Contains(handlers, orders.Email) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "emails_sent"}.Sanitize()+` WHERE id > $1`,
			maxEmailID).Scan(&rep.EmailsSent); err != nil {
			return rep, err
		}
		if rep.EmailsSent != int64(events) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("emails_sent: %d raw-copy rows, want %d", rep.EmailsSent, events))
		}
	}
	return rep, nil
}

// pgSettings are the Postgres settings the figures depend on.
func pgSettings(ctx context.Context, pool *pgxpool.Pool) map[string]string {
	out := map[string]string{}
	for _, name := range []string{"server_version", "shared_buffers", "effective_cache_size", "work_mem", "maintenance_work_mem",
		"max_wal_size", "checkpoint_timeout", "synchronous_commit", "wal_compression"} {
		var v string
		if err := pool.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err == nil {
			out[name] = v
		}
	}
	return out
}

// redactDSN replaces the value of -dsn in args, which may hold a
// password, so that the command can be written in the report.
func redactDSN(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		switch {
		case a == "-dsn" || a == "--dsn":
			if i+1 < len(out) {
				out[i+1] = "$DSN"
			}
		case strings.HasPrefix(a, "-dsn=") || strings.HasPrefix(a, "--dsn="):
			out[i] = a[:strings.Index(a, "=")+1] + "$DSN"
		}
	}
	return out
}
