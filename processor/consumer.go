package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/sink"
)

// Writer is what a Consumer needs from the Postgres side; *sink.Writer
// implements it. Write must be safe for concurrent use by several workers.
type Writer interface {
	// Write applies one batch in one transaction; see sink.Writer.Write.
	Write(ctx context.Context, b *sink.Batch) (sink.Result, error)
	// StoredOffsets returns the next offset stored for each partition that
	// has one.
	StoredOffsets(ctx context.Context, topic string, partitions []int32) (map[int32]int64, error)
}

// Config configures a Consumer. Zero values take the defaults noted.
type Config struct {
	Brokers  []string // required
	Topics   []string // required
	Group    string   // required
	ClientID string   // default "onceflow"

	BatchMaxRecords int           // close a batch at this many records; default 1000
	BatchMaxBytes   int           // or at this many value bytes; default 4 MiB
	BatchLinger     time.Duration // or this long after its first record; default 50ms

	Decode DecodeConfig // event id location and record size limit

	// DeadLetterTopic receives every dead letter, with headers reason,
	// topic, partition and offset, before its batch commits. Empty: dead
	// letters go to the dead_letters table only.
	DeadLetterTopic string

	// CommitInterval is how often marked Kafka offsets are committed in the
	// background; they are also committed on revoke and on shutdown.
	// Default 1s. Postgres holds the true offset, so a lagging Kafka commit
	// costs no replay.
	CommitInterval time.Duration
	// SessionTimeout and RebalanceTimeout are the group's; defaults 10s and 30s.
	SessionTimeout   time.Duration
	RebalanceTimeout time.Duration
	// DrainTimeout bounds finishing an in-flight batch on revoke or
	// shutdown before it is aborted; default 10s.
	DrainTimeout time.Duration
	// RetryBackoff is the first wait after a failed transaction, doubling
	// up to MaxRetryBackoff; defaults 100ms and 5s.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration

	Logger         *slog.Logger                  // nil discards
	TracerProvider trace.TracerProvider          // nil disables tracing
	Propagator     propagation.TextMapPropagator // reads producer span contexts; default W3C trace context

	// OnBatch, if set, is called after each batch commits, from that
	// partition's worker goroutine (so concurrently across partitions).
	OnBatch func(BatchInfo)

	// KafkaOptions are appended to the client's options (TLS, SASL, test
	// tuning). Options that conflict with the consumer's own behaviour,
	// such as auto-commit settings, must not be passed.
	KafkaOptions []kgo.Opt
}

// BatchInfo describes one committed batch.
type BatchInfo struct {
	Topic      string
	Partition  int32
	Records    int
	NextOffset int64
	Result     sink.Result
	Duration   time.Duration // from the batch closing to its COMMIT, retries included
}

// Stats are a Consumer's counters since New.
type Stats struct {
	RecordsConsumed int64 // records received from Kafka, duplicates included
	Batches         int64 // batches committed
	Applied         int64 // (event, handler) pairs applied
	SkippedLRU      int64
	SkippedPostgres int64
	DeadLetters     int64
	Fenced          int64 // batches rolled back by the offset fence
	Retries         int64 // transactions retried after an error
	Assigned        int64 // partitions assigned, over all rebalances
	Revoked         int64
	Lost            int64
	Workers         int64 // partition workers running now
}

// Plus returns the field-by-field sum of s and o, to total several members.
func (s Stats) Plus(o Stats) Stats {
	s.RecordsConsumed += o.RecordsConsumed
	s.Batches += o.Batches
	s.Applied += o.Applied
	s.SkippedLRU += o.SkippedLRU
	s.SkippedPostgres += o.SkippedPostgres
	s.DeadLetters += o.DeadLetters
	s.Fenced += o.Fenced
	s.Retries += o.Retries
	s.Assigned += o.Assigned
	s.Revoked += o.Revoked
	s.Lost += o.Lost
	s.Workers += o.Workers
	return s
}

type counters struct {
	records, batches, applied, skippedLRU, skippedPG, dead, fenced, retries atomic.Int64
	assigned, revoked, lost, workers                                        atomic.Int64
}

// Consumer is one consumer-group member. Create it with New, run it with
// Run; a Consumer runs once. Stats is safe to call concurrently with Run.
type Consumer struct {
	cfg    Config
	writer Writer
	log    *slog.Logger
	tracer trace.Tracer
	traced bool // false: no per-record trace-context extraction at all
	stats  counters

	mu      sync.Mutex
	workers map[tp]*worker
	cl      *kgo.Client
	base    context.Context // parent of worker contexts; outlives Run's ctx for draining
	ran     atomic.Bool

	aborting  atomic.Bool
	abortOnce sync.Once
	abortRun  chan struct{} // closed by Abort
}

type tp struct {
	topic     string
	partition int32
}

// New validates cfg and returns a Consumer. Every problem is reported.
func New(cfg Config, w Writer) (*Consumer, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "onceflow"
	}
	if cfg.BatchMaxRecords <= 0 {
		cfg.BatchMaxRecords = 1000
	}
	if cfg.BatchMaxBytes <= 0 {
		cfg.BatchMaxBytes = 4 << 20
	}
	def(&cfg.BatchLinger, 50*time.Millisecond)
	def(&cfg.CommitInterval, time.Second)
	def(&cfg.SessionTimeout, 10*time.Second)
	def(&cfg.RebalanceTimeout, 30*time.Second)
	def(&cfg.DrainTimeout, 10*time.Second)
	def(&cfg.RetryBackoff, 100*time.Millisecond)
	def(&cfg.MaxRetryBackoff, 5*time.Second)
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	var problems []error
	if w == nil {
		problems = append(problems, errors.New("processor: nil writer"))
	}
	if len(cfg.Brokers) == 0 {
		problems = append(problems, errors.New("processor: no brokers"))
	}
	if len(cfg.Topics) == 0 {
		problems = append(problems, errors.New("processor: no topics"))
	}
	if cfg.Group == "" {
		problems = append(problems, errors.New("processor: no consumer group"))
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	provider := cfg.TracerProvider
	if provider == nil {
		provider = noop.NewTracerProvider()
	}
	_, untraced := provider.(noop.TracerProvider)
	return &Consumer{
		cfg:      cfg,
		writer:   w,
		log:      log,
		tracer:   provider.Tracer("github.com/onceflow/onceflow/processor"),
		traced:   !untraced,
		workers:  map[tp]*worker{},
		abortRun: make(chan struct{}),
	}, nil
}

// Abort stops Run as a crash would, as far as Kafka and Postgres can tell:
// in-flight transactions are canceled (they roll back) and no Kafka offset
// is committed, not even those already marked. Run then returns. Whatever
// was committed to Postgres stays, and the partitions' next owners resume
// from the offsets stored there. Abort is safe to call at any time, more
// than once, and concurrently with Run.
func (c *Consumer) Abort() {
	c.abortOnce.Do(func() {
		c.aborting.Store(true)
		close(c.abortRun)
	})
}

// PartitionLag is how far one assigned partition's worker is behind the
// partition's high watermark, as of the last fetch.
type PartitionLag struct {
	Topic     string
	Partition int32
	Lag       int64
}

// Lag returns the lag of every partition assigned now.
func (c *Consumer) Lag() []PartitionLag {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]PartitionLag, 0, len(c.workers))
	for k, w := range c.workers {
		hw := w.hw.Load()
		if hw < 0 {
			continue
		}
		out = append(out, PartitionLag{Topic: k.topic, Partition: k.partition, Lag: max(0, hw-w.next.Load())})
	}
	return out
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		RecordsConsumed: s.records.Load(), Batches: s.batches.Load(), Applied: s.applied.Load(),
		SkippedLRU: s.skippedLRU.Load(), SkippedPostgres: s.skippedPG.Load(), DeadLetters: s.dead.Load(),
		Fenced: s.fenced.Load(), Retries: s.retries.Load(),
		Assigned: s.assigned.Load(), Revoked: s.revoked.Load(), Lost: s.lost.Load(), Workers: s.workers.Load(),
	}
}

// Run joins the group and processes records until ctx is canceled, then
// drains: in-flight batches finish (within DrainTimeout), marked offsets are
// committed, and the member leaves the group. Run returns only after every
// worker it started has exited. It returns an error if the client cannot be
// created or the brokers do not answer at start; a canceled ctx is a clean
// stop and returns nil.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return errors.New("processor: Run called twice")
	}
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	c.base = base
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	go func() {
		select {
		case <-c.abortRun:
			cancelRun()
		case <-ctx.Done():
		}
	}()

	opts := []kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ClientID(c.cfg.ClientID),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.BlockRebalanceOnPoll(),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(c.cfg.CommitInterval),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		kgo.RebalanceTimeout(c.cfg.RebalanceTimeout),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.AdjustFetchOffsetsFn(c.adjust),
		kgo.WithLogger(kgoLogger{c.log}),
	}
	cl, err := kgo.NewClient(append(opts, c.cfg.KafkaOptions...)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	c.mu.Lock()
	c.cl = cl
	c.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = cl.Ping(pctx)
	cancel()
	if err != nil {
		cl.Close()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kafka brokers %v do not answer: %w", c.cfg.Brokers, err)
	}
	c.log.Info("consumer started", "group", c.cfg.Group, "topics", c.cfg.Topics, "client_id", c.cfg.ClientID)

	for {
		fetches := cl.PollRecords(ctx, 4*c.cfg.BatchMaxRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
			}
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			c.mu.Lock()
			w := c.workers[tp{p.Topic, p.Partition}]
			c.mu.Unlock()
			if w == nil {
				return // revoked since the fetch; the next owner reads them
			}
			c.stats.records.Add(int64(len(p.Records)))
			w.hw.Store(p.HighWatermark)
			select {
			case w.recs <- p.Records:
			case <-w.done:
			case <-ctx.Done():
			}
		})
		cl.AllowRebalance()
	}
	cl.AllowRebalance()

	if c.aborting.Load() {
		c.stopAll(true)
		cl.Close()
		c.log.Warn("consumer aborted: in-flight batches rolled back, no Kafka offset committed", "group", c.cfg.Group)
		return nil
	}
	// Drain: finish in-flight batches, commit, leave.
	c.stopAll(false)
	dctx, cancel := context.WithTimeout(base, c.cfg.DrainTimeout)
	defer cancel()
	if err := c.commit(dctx, cl, "shutdown"); err != nil {
		c.log.Warn("commit offsets on shutdown", "err", err)
	}
	cl.Close() // leaves the group
	c.log.Info("consumer stopped", "group", c.cfg.Group)
	return nil
}

// assigned starts a worker per new partition, fenced at the offset stored
// in Postgres.
func (c *Consumer) assigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	for topic, parts := range assigned {
		stored, err := c.storedOffsets(ctx, topic, parts)
		if err != nil {
			c.log.Error("read stored offsets; workers will read them before their first batch",
				"topic", topic, "err", err)
		}
		c.mu.Lock()
		for _, p := range parts {
			key := tp{topic, p}
			if c.workers[key] != nil {
				continue
			}
			fence := int64(noRow)
			switch s, ok := stored[p]; {
			case err != nil:
				fence = unknownFence
			case ok:
				fence = s
			}
			w := newWorker(c, cl, key, fence)
			c.workers[key] = w
			c.stats.assigned.Add(1)
			c.stats.workers.Add(1)
			go w.run()
		}
		c.mu.Unlock()
		c.log.Info("partitions assigned", "topic", topic, "partitions", parts)
	}
}

func (c *Consumer) storedOffsets(ctx context.Context, topic string, parts []int32) (map[int32]int64, error) {
	var err error
	for attempt := range 3 {
		var stored map[int32]int64
		if stored, err = c.writer.StoredOffsets(ctx, topic, parts); err == nil {
			return stored, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return nil, err
}

// adjust starts each partition at the offset stored in Postgres when it is
// ahead of the offset Kafka has committed (or Kafka has none).
func (c *Consumer) adjust(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range offsets {
		for p, off := range parts {
			w := c.workers[tp{topic, p}]
			if w == nil {
				continue
			}
			committed := off.EpochOffset().Offset
			fence := w.fence.Load()
			if fence >= 0 && (committed < 0 || fence > committed) {
				parts[p] = kgo.NewOffset().At(fence).WithEpoch(-1)
				w.next.Store(fence)
				c.log.Info("resuming from the offset stored in postgres", "topic", topic, "partition", p,
					"offset", fence, "kafka_committed", committed)
			} else if committed >= 0 {
				w.next.Store(committed)
			}
		}
	}
	return offsets, nil
}

func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	n := c.stop(revoked, c.aborting.Load())
	c.stats.revoked.Add(int64(n))
	if c.aborting.Load() {
		return
	}
	if err := c.commit(ctx, cl, "revoke"); err != nil {
		c.log.Warn("commit offsets on revoke", "err", err)
	}
	if n > 0 {
		c.log.Info("partitions revoked", "partitions", revoked)
	}
}

// commit synchronously commits the marked offsets, in a span of its own.
func (c *Consumer) commit(ctx context.Context, cl *kgo.Client, why string) error {
	ctx, span := c.tracer.Start(ctx, "kafka.commit_offsets", trace.WithAttributes(attribute.String("onceflow.reason", why)))
	defer span.End()
	err := cl.CommitMarkedOffsets(ctx)
	if err != nil {
		span.RecordError(err)
	}
	return err
}

func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	n := c.stop(lost, true)
	c.stats.lost.Add(int64(n))
	if n > 0 {
		c.log.Warn("partitions lost; in-flight batches aborted, nothing committed", "partitions", lost)
	}
}

// stop stops the workers of the given partitions and waits for them: abort
// cancels their transactions, otherwise they finish the batch in hand.
func (c *Consumer) stop(parts map[string][]int32, abort bool) int {
	c.mu.Lock()
	var ws []*worker
	for topic, ps := range parts {
		for _, p := range ps {
			if w := c.workers[tp{topic, p}]; w != nil {
				delete(c.workers, tp{topic, p})
				ws = append(ws, w)
			}
		}
	}
	c.mu.Unlock()
	c.wait(ws, abort)
	return len(ws)
}

func (c *Consumer) stopAll(abort bool) {
	c.mu.Lock()
	ws := make([]*worker, 0, len(c.workers))
	for k, w := range c.workers {
		delete(c.workers, k)
		ws = append(ws, w)
	}
	c.mu.Unlock()
	c.wait(ws, abort)
}

func (c *Consumer) wait(ws []*worker, abort bool) {
	for _, w := range ws {
		if abort {
			w.abort()
		}
		close(w.quit)
	}
	for _, w := range ws {
		<-w.done
		c.stats.workers.Add(-1)
	}
}

// kgoLogger sends franz-go's own logs (warnings and errors) to slog.
type kgoLogger struct{ log *slog.Logger }

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	l.log.Log(context.Background(), lv, "kafka: "+msg, keyvals...)
}
