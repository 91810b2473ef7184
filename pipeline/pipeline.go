package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// Config configures a Runner. Zero values take the defaults noted; the
// Kafka and Postgres sides' own defaults are those of processor.Config
// and sink.Config.
type Config struct {
	Brokers []string // required: seed brokers, host:port
	Topics  []string // required: the topics consumed
	// Group is the consumer group (required). It is also the key of the
	// partitions' offsets stored in Postgres: two programs with different
	// handlers on the same topics need different groups.
	Group string
	// DeadLetterTopic receives a copy of every dead letter, published
	// asynchronously from the dead_letters table, at least once. Empty:
	// the table only.
	DeadLetterTopic string

	// Pool and DSN say where Postgres is: exactly one of them. Pool is
	// the caller's and Run does not close it. From DSN, Run opens a pool
	// of PoolSize connections (default DefaultPoolSize) and closes it
	// before it returns; Run connects only when it starts, so a program
	// can start while Postgres is down.
	Pool     *pgxpool.Pool
	DSN      string
	PoolSize int
	// Schema holds onceflow's tables (created if missing); default
	// sink.DefaultSchema ("public"). It is also the schema passed to
	// Migrate.
	Schema string

	// Handlers apply the events' effects, in this order, each in the
	// batch's transaction (required; names unique and not empty).
	Handlers []sink.Handler
	// Migrate, if set, creates or upgrades the handlers' own tables. Run
	// calls it after creating onceflow's tables and before consuming,
	// waiting for Postgres as for those; it must be idempotent (Run calls
	// it at every start, possibly from several processes at once).
	Migrate migrate.Func
	// BeforeConsume, if set, is called once Postgres answers and every
	// migration ran, before the consumer starts: the place for start
	// checks that need the database or the brokers (waiting for the
	// brokers, checking credentials, checking SQL against the tables).
	// Its error ends Run; when ctx ends while it runs, Run returns nil.
	BeforeConsume func(ctx context.Context) error

	// LRUSize is how many events the dedup cache holds, each with the
	// handlers whose claim of it is known committed; default
	// DefaultLRUSize. Negative disables the cache: every key is then
	// claimed in Postgres (which stays the truth either way).
	LRUSize int
	// Retention is the dedup horizon: processed_events keeps every claim
	// at least this long, and Run drops the slices past it (see
	// dedup.Retention). A redelivery within the horizon is always caught;
	// one older may be applied again. 0 keeps claims forever. Run also
	// warns when a consumed topic keeps records longer than the horizon.
	Retention time.Duration
	// RetentionSlices is how many slices one horizon spans; default
	// dedup.DefaultRetentionSlices (1). See dedup.Retention.
	RetentionSlices int

	Logger *slog.Logger // nil discards
	// TracerProvider, if set (and not a no-op one), traces batches, their
	// Postgres calls on a pool opened from DSN (otelpgx) and the Kafka
	// client (kotel). The program owns the provider and flushes it.
	TracerProvider trace.TracerProvider
	// Metrics, if set, exports the consumer's and the cache's counters,
	// every committed batch, the pool's saturation (pool="main"), the age
	// of the oldest dead letter not yet on DeadLetterTopic (when set) and
	// the dedup retention's slices (when Retention is set).
	Metrics *metrics.Metrics

	// Consumer tunes the Kafka side: batching, decoding, timeouts, client
	// id, extra client options (TLS, SASL). The fields Config has itself
	// (Brokers, Topics, Group, DeadLetterTopic, Logger, TracerProvider)
	// must be left zero in it. OnBatch is called after Metrics is fed.
	Consumer processor.Config
	// Writer tunes the Postgres side: Bus, TxTimeout, skip-log limits. The
	// fields Config has itself (Schema, Group, Handlers, Cache, Logger,
	// TracerProvider) must be left zero in it.
	Writer sink.Config
}

// Defaults of Config.
const (
	DefaultPoolSize = 4
	DefaultLRUSize  = 100000
)

func (c Config) withDefaults() Config {
	if c.PoolSize == 0 {
		c.PoolSize = DefaultPoolSize
	}
	if c.Schema == "" {
		c.Schema = sink.DefaultSchema
	}
	if c.LRUSize == 0 {
		c.LRUSize = DefaultLRUSize
	}
	return c
}

// Validate returns every problem with c (after defaults), each naming its
// field; New calls it. It never includes the DSN in its messages.
func (c Config) Validate() error {
	c = c.withDefaults()
	var ps []error
	bad := func(format string, args ...any) { ps = append(ps, fmt.Errorf("pipeline: "+format, args...)) }
	switch {
	case c.Pool == nil && c.DSN == "":
		bad("no Postgres: set Pool or DSN")
	case c.Pool != nil && c.DSN != "":
		bad("both Pool and DSN are set: set one")
	case c.DSN != "":
		if _, err := pgxpool.ParseConfig(c.DSN); err != nil {
			bad("DSN is not a valid connection string (postgres://user:password@host:port/db?sslmode=disable)")
		}
	}
	if c.PoolSize < 1 {
		bad("PoolSize %d is below 1", c.PoolSize)
	}
	if c.Retention < 0 {
		bad("Retention %v is negative (0 keeps the dedup state forever)", c.Retention)
	}
	if c.Retention > 0 {
		if err := c.retention(&pgxpool.Pool{}).Validate(); err != nil {
			ps = append(ps, err)
		}
	}
	type field struct {
		name string
		set  bool
	}
	k, w := c.Consumer, c.Writer
	for _, f := range []field{{"Brokers", k.Brokers != nil}, {"Topics", k.Topics != nil}, {"Group", k.Group != ""},
		{"DeadLetterTopic", k.DeadLetterTopic != ""}, {"Logger", k.Logger != nil}, {"TracerProvider", k.TracerProvider != nil}} {
		if f.set {
			bad("Consumer.%s is set: set Config.%s instead", f.name, f.name)
		}
	}
	for _, f := range []field{{"Schema", w.Schema != ""}, {"Group", w.Group != ""}, {"Handlers", w.Handlers != nil},
		{"Cache", w.Cache != nil}, {"Logger", w.Logger != nil}, {"TracerProvider", w.TracerProvider != nil}} {
		if f.set {
			bad("Writer.%s is set: set Config.%s instead", f.name, f.name)
		}
	}
	ps = append(ps, c.consumerConfig(nil).Validate())
	wc := c.writerConfig(nil)
	if wc.Group == "" {
		wc.Group = "-" // reported once, by the consumer's Validate
	}
	ps = append(ps, wc.Validate())
	return errors.Join(ps...)
}

// consumerConfig is the processor's config: Consumer with Config's own
// fields, and OnBatch feeding Metrics first.
func (c Config) consumerConfig(m *metrics.Metrics) processor.Config {
	k := c.Consumer
	k.Brokers, k.Topics, k.Group, k.DeadLetterTopic = c.Brokers, c.Topics, c.Group, c.DeadLetterTopic
	k.Logger, k.TracerProvider = c.Logger, c.TracerProvider
	k.DedupHorizon = c.Retention
	if m != nil {
		next := k.OnBatch
		k.OnBatch = func(b processor.BatchInfo) {
			m.OnBatch(b)
			if next != nil {
				next(b)
			}
		}
	}
	if traced(c.TracerProvider) {
		id := k.ClientID
		if id == "" {
			id = processor.DefaultClientID
		}
		kt := kotel.NewKotel(kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(c.TracerProvider),
			kotel.ClientID(id), kotel.ConsumerGroup(c.Group))))
		k.KafkaOptions = append(append([]kgo.Opt(nil), k.KafkaOptions...), kgo.WithHooks(kt.Hooks()...))
	}
	return k
}

// retention is the dedup retention over pool.
// Drops are held while a replay has not caught up.
func (c Config) retention(pool *pgxpool.Pool) dedup.Retention {
	r := dedup.Retention{Pool: pool, Schema: c.Schema, Horizon: c.Retention, Slices: c.RetentionSlices, Logger: c.Logger,
		Hold: sink.HoldForReplays(pool, c.Schema, c.Retention)}
	if c.Metrics != nil {
		r.OnStep = c.Metrics.OnRetentionStep
	}
	return r
}

// writerConfig is the sink's config: Writer with Config's own fields.
func (c Config) writerConfig(cache *dedup.Cache) sink.Config {
	w := c.Writer
	w.Schema, w.Group, w.Handlers, w.Cache = c.Schema, c.Group, c.Handlers, cache
	w.Logger, w.TracerProvider = c.Logger, c.TracerProvider
	return w
}

// traced reports whether tp records anything.
func traced(tp trace.TracerProvider) bool {
	if tp == nil {
		return false
	}
	_, off := tp.(noop.TracerProvider)
	return !off
}

// Runner runs one member of a consumer group and its Postgres side: see
// the package doc. Create it with New and run it once with Run; Ready,
// Stats, Partitions, Abort and Kill are safe to call at any time,
// concurrently with Run.
type Runner struct {
	cfg     Config
	poolCfg *pgxpool.Config // parsed Config.DSN; nil with Config.Pool
	log     *slog.Logger
	ran     atomic.Bool

	mu       sync.Mutex
	aborted  bool
	killed   bool                // Kill, not Abort: the consumer never leaves the group
	stopWait context.CancelFunc  // ends Run's wait for Postgres; nil before Run
	consumer *processor.Consumer // set once Postgres is ready and migrated
}

// New validates cfg and returns a Runner; every problem with cfg is
// reported at once. It does not touch Postgres or Kafka.
func New(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, log: cfg.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if cfg.DSN != "" {
		pc, err := pgxpool.ParseConfig(cfg.DSN) // parsed by Validate
		if err != nil {
			return nil, errors.New("pipeline: DSN is not a valid connection string")
		}
		pc.MaxConns = int32(cfg.PoolSize)
		if traced(cfg.TracerProvider) && pc.ConnConfig.Tracer == nil {
			pc.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(cfg.TracerProvider))
		}
		r.poolCfg = pc
	}
	return r, nil
}

// Run validates cfg, then runs it until ctx ends: New(cfg), then Run.
func Run(ctx context.Context, cfg Config) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// Run waits for Postgres, creates or upgrades onceflow's tables and then
// the handlers' (Config.Migrate), and consumes until ctx ends. It then
// drains — in-flight batches finish within the drain timeout
// (processor.Config.DrainTimeout), offsets are committed, the member
// leaves the group — and returns nil once every goroutine it started has
// exited. The end of ctx while waiting for Postgres also returns nil:
// nothing had started.
//
// Run returns an error only for what waiting cannot cure: a Postgres that
// refuses the credentials or does not know the database or role, a
// migration that fails (a Postgres problem that goes away by itself —
// down, starting, out of connections — is waited for with capped backoff,
// logged as "waiting for postgres"), or Kafka client options the client
// refuses. Brokers that do not answer are waited for by the consumer
// (Ready says so). Run may be called once.
func (r *Runner) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return errors.New("pipeline: Run called twice")
	}
	wctx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	r.mu.Lock()
	r.stopWait = stopWait
	aborted := r.aborted
	r.mu.Unlock()
	if aborted {
		return nil
	}

	pool := r.cfg.Pool
	if pool == nil {
		p, err := pgxpool.NewWithConfig(ctx, r.poolCfg) // connects lazily
		if err != nil {
			return fmt.Errorf("pipeline: postgres pool: %w", err)
		}
		defer p.Close()
		pool = p
	}
	pg := newWaiter(pool, r.log)
	schema := r.cfg.Schema
	type step struct {
		what  string
		bound time.Duration // of one attempt
		f     func(context.Context) error
	}
	steps := []step{
		{"connect", waitCall, pool.Ping},
		{"migrate", waitMigration, func(ctx context.Context) error { return sink.Migrate(ctx, pool, schema) }},
	}
	if r.cfg.Migrate != nil {
		steps = append(steps, step{"migrate handlers' tables", waitMigration,
			func(ctx context.Context) error { return r.cfg.Migrate(ctx, pool, schema) }})
	}
	for _, s := range steps {
		if s.bound == waitMigration {
			r.log.Info("migrating tables: an upgrade may rebuild a large table, and a migration in another schema of the database is waited for",
				"step", s.what, "schema", schema)
		}
		if err := pg.wait(wctx, s.what, s.bound, s.f); err != nil {
			if wctx.Err() != nil {
				return nil // ctx ended or Abort: nothing had started
			}
			return err
		}
	}

	if r.cfg.BeforeConsume != nil {
		if err := r.cfg.BeforeConsume(wctx); err != nil {
			if wctx.Err() != nil {
				return nil
			}
			return err
		}
	}

	cache, err := dedup.New(max(r.cfg.LRUSize, 0))
	if err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	w, err := sink.New(pool, r.cfg.writerConfig(cache))
	if err != nil {
		return err
	}
	c, err := processor.New(r.cfg.consumerConfig(r.cfg.Metrics), w)
	if err != nil {
		return err
	}
	if m := r.cfg.Metrics; m != nil {
		m.Add(c, cache)
		m.AddPool("main", pool)
		if r.cfg.DeadLetterTopic != "" {
			m.AddDeadLetterTopic(w.OldestUnpublishedDeadLetter)
		}
	}
	r.mu.Lock()
	r.consumer, aborted = c, r.aborted
	killed := r.killed
	r.mu.Unlock()
	switch {
	case killed:
		c.Kill() // Kill came between the wait and now: Run returns at once
	case aborted:
		c.Abort() // Abort came between the wait and now: Run returns at once
	}
	if r.cfg.Retention > 0 {
		// Retention runs while the consumer does, and stops with it.
		rctx, stopRetention := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = r.cfg.retention(pool).Run(rctx) // validated by New
		}()
		defer func() { stopRetention(); <-done }()
	}
	return c.Run(ctx)
}

// ErrNotConsuming is what Ready returns before Run has its consumer: Run
// is not called yet, or it waits for Postgres or migrates.
var ErrNotConsuming = errors.New("the consumer has not started: waiting for postgres and the start checks")

// Ready returns nil when the pipeline consumes and its brokers answered
// the member's last check (every few seconds), else why not:
// ErrNotConsuming while Run waits for Postgres, then the consumer's
// reason (processor.Consumer.Ready). Once consuming it does not ping
// Postgres; a readiness endpoint adds a ping of the pool for that. It
// does not block.
func (r *Runner) Ready() error {
	r.mu.Lock()
	c := r.consumer
	r.mu.Unlock()
	if c == nil {
		return ErrNotConsuming
	}
	return c.Ready()
}

// Stats returns the consumer's counters (zero before it started).
func (r *Runner) Stats() processor.Stats {
	r.mu.Lock()
	c := r.consumer
	r.mu.Unlock()
	if c == nil {
		return processor.Stats{}
	}
	return c.Stats()
}

// Partitions returns the state of every partition the member runs a
// worker for now (processor.Consumer.Partitions); nil before Run has its
// consumer.
func (r *Runner) Partitions() []processor.PartitionState {
	r.mu.Lock()
	c := r.consumer
	r.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Partitions()
}

// Kill stops Run as a SIGKILL would: as Abort, and the member never
// leaves the group (processor.Consumer.Kill): its partitions stay
// assigned to it until the group's session timeout expires. Before Run
// has its consumer, Kill is Abort. Kill is safe to call at any time and
// more than once.
func (r *Runner) Kill() {
	r.mu.Lock()
	r.aborted, r.killed = true, true
	c, stopWait := r.consumer, r.stopWait
	r.mu.Unlock()
	if stopWait != nil {
		stopWait()
	}
	if c != nil {
		c.Kill()
	}
}

// Abort stops Run as a crash would: in-flight transactions roll back (a
// COMMIT already sent is waited for) and no Kafka offset is committed (see
// processor.Consumer.Abort); waiting for Postgres ends at once. Run then
// returns nil. What committed to Postgres
// stays, and the partitions' next owners resume from there. Abort is safe
// to call at any time and more than once; after it, Run does nothing.
func (r *Runner) Abort() {
	r.mu.Lock()
	r.aborted = true
	c, stopWait := r.consumer, r.stopWait
	r.mu.Unlock()
	if stopWait != nil {
		stopWait()
	}
	if c != nil {
		c.Abort()
	}
}
