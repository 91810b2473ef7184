package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/sink"
)

// Writer is what a Consumer needs from the Postgres side; *sink.Writer
// implements it. Its methods must be safe for concurrent use.
type Writer interface {
	// Take makes this member the writer of the partitions and returns
	// their leases; see sink.Writer.Take.
	Take(ctx context.Context, topic string, partitions []int32) (map[int32]sink.Lease, error)
	// Write applies one batch in one transaction; see sink.Writer.Write.
	// b, its Events slice included, is the worker's again once Write
	// returns (the next batch reuses the slice): Write must not keep it.
	// A batch may have no events and no dead letters: a worker told to
	// stop stores the offset its last batches deferred that way, moving
	// it over records those batches found applied.
	Write(ctx context.Context, b *sink.Batch) (sink.Result, error)
	// LeaseDeadLetters and MarkDeadLettersPublished feed the dead-letter
	// topic from the dead_letters table; see sink.Writer.
	LeaseDeadLetters(ctx context.Context, limit int, lease time.Duration) ([]sink.PendingDeadLetter, error)
	MarkDeadLettersPublished(ctx context.Context, ids []int64, notes []string) error
}

// BatchInfo describes one committed batch, or one found whole that
// deferred its offset (Result.OffsetDeferred) and wrote nothing.
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
	// RecordsFetched counts the records decoded from fetch responses,
	// delivered or not: beyond RecordsConsumed, a paused partition's
	// in-flight fetch (fetched again on resume), fetches a rebalance or a
	// seek discarded, aborted transactions' records and markers, records
	// before the fetch offset in a partition's first batch, and records
	// of partitions this member no longer writes.
	RecordsFetched       int64
	Batches              int64 // batches committed, or found whole with their offset deferred
	OffsetsDeferred      int64 // batches found whole that wrote nothing, their offset left to a later batch (sink.Batch.DeferOffset)
	Applied              int64 // (event, handler) pairs applied
	SkippedLRU           int64
	SkippedPostgres      int64
	DeadLetters          int64 // dead_letters rows inserted; a record read again whose dead letter was recorded before is not counted
	Conflicts            int64 // events dead-lettered as conflicting duplicates (included in DeadLetters)
	DeadLettersPublished int64 // dead letters copied to the dead-letter topic
	Fenced               int64 // batches refused by the offset fence (the worker then stopped)
	Retries              int64 // transactions retried after an error
	OffsetsOutOfRange    int64 // stored offsets found outside their partition's log
	Assigned             int64 // partitions assigned, over all rebalances
	Revoked              int64
	Lost                 int64
	Workers              int64 // partition workers running now
	Retrying             int64 // partitions whose batch is waiting to be retried now
	QueuedRecords        int64 // records in the partitions' queues now, waiting for their worker
	QueuedBytes          int64 // their values' bytes
}

// Plus returns the field-by-field sum of s and o, to total several members.
func (s Stats) Plus(o Stats) Stats {
	s.RecordsConsumed += o.RecordsConsumed
	s.RecordsFetched += o.RecordsFetched
	s.Batches += o.Batches
	s.OffsetsDeferred += o.OffsetsDeferred
	s.Applied += o.Applied
	s.SkippedLRU += o.SkippedLRU
	s.SkippedPostgres += o.SkippedPostgres
	s.DeadLetters += o.DeadLetters
	s.Conflicts += o.Conflicts
	s.DeadLettersPublished += o.DeadLettersPublished
	s.Fenced += o.Fenced
	s.Retries += o.Retries
	s.OffsetsOutOfRange += o.OffsetsOutOfRange
	s.Assigned += o.Assigned
	s.Revoked += o.Revoked
	s.Lost += o.Lost
	s.Workers += o.Workers
	s.Retrying += o.Retrying
	s.QueuedRecords += o.QueuedRecords
	s.QueuedBytes += o.QueuedBytes
	return s
}

type counters struct {
	records, batches, applied, skippedLRU, skippedPG, dead, published, fenced, retries atomic.Int64
	outOfRange, assigned, revoked, lost, workers, retrying, conflicts, fetched         atomic.Int64
	deferred                                                                           atomic.Int64
}

// Consumer is one consumer-group member. Create it with New, run it with
// Run; a Consumer runs once. Stats, Lag, Ready, Abort and Kill are safe to
// call concurrently with Run.
type Consumer struct {
	cfg    Config
	writer Writer
	log    *slog.Logger
	tracer trace.Tracer
	traced bool // false: no per-record trace-context extraction at all
	stats  counters
	// repeats holds back log lines said again soon: fetch errors and
	// franz-go's own warnings.
	repeats repeats
	// commits says each Kafka commit refused for the member's epoch once
	// (offsets.go); fencedBy is set when another member took this one's
	// instance id (protocol.go).
	commits  commitNotes
	fencedBy atomic.Pointer[error]

	mu    sync.Mutex
	parts map[tp]*partition // the partitions assigned to this member now
	// clientSet is closed once cl is set: the group may join, and call
	// adjust, before kgo.NewClient has returned.
	clientSet chan struct{}
	// topicIDs are the Kafka ids of the consumed topics as of their last
	// assignment, stored with each batch's offset.
	topicIDs map[string]uuid.NullUUID
	cl       *kgo.Client
	ran      atomic.Bool

	// hard is the parent of every worker's context; Abort cancels it, so
	// every in-flight transaction rolls back (but one whose COMMIT was
	// sent, which the Writer waits for: see Abort).
	hard         context.Context
	cancelHard   context.CancelFunc
	cancelRun    context.CancelFunc
	aborting     atomic.Bool
	killed       atomic.Bool        // Kill: the client's context is canceled too
	cancelClient context.CancelFunc // the client's context's (Kill); guarded by mu

	ready  atomic.Pointer[error] // nil until the brokers were asked once
	fatal  atomic.Pointer[error] // what ended Run, when no retry could fix it (fail)
	dlWake chan struct{}         // size 1: a batch committed dead letters
}

type tp struct {
	topic     string
	partition int32
}

// partition is one assigned partition: its worker, or why it has none.
type partition struct {
	w        *worker   // nil while fenced (waiting to take it again) or paused out of range
	retakeAt time.Time // when w is nil after a fence: when to take the partition again
	hw       int64     // high watermark at the last fetch, else at assignment; -1 when unknown
	start    int64     // log start at assignment: where a worker with no next offset starts
}

// New validates cfg and returns a Consumer. Every problem is reported.
func New(cfg Config, w Writer) (*Consumer, error) {
	cfg = cfg.withDefaults()
	err := cfg.Validate()
	if w == nil {
		err = errors.Join(errors.New("processor: nil writer"), err)
	}
	if err != nil {
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
		cfg:    cfg,
		writer: w,
		log:    log,
		tracer: provider.Tracer("github.com/onceflow/onceflow/processor"),
		traced: !untraced,
		parts:  map[tp]*partition{}, topicIDs: map[string]uuid.NullUUID{}, clientSet: make(chan struct{}),
		dlWake: make(chan struct{}, 1),
	}, nil
}

// Abort stops Run as a crash would, as far as Postgres can tell:
// in-flight transactions are canceled (they roll back) and no Kafka offset
// is committed, not even those already marked. Run then returns, having
// closed its client, which leaves the group: the partitions are assigned
// again at once. Kill does not leave. Whatever
// was committed to Postgres stays, and the partitions' next owners resume
// from the offsets stored there. A transaction whose COMMIT was sent
// cannot be taken back: sink.Writer waits for its answer (within
// sink.Config.TxTimeout), and a batch that committed is counted in Stats —
// the next owners will not read it again, so no one else counts it — but
// its Kafka offset is not marked. Abort during a drain
// ends the drain at once, but for such a COMMIT. Abort is safe to call at
// any time, more than once, and concurrently with Run.
func (c *Consumer) Abort() {
	c.abort(false)
}

// fail ends Run as Abort does and makes it return err: for what no retry
// fixes, such as the schema registry refusing the credentials. The first
// error is kept. Safe to call from any goroutine, more than once.
func (c *Consumer) fail(err error) {
	if c.fatal.CompareAndSwap(nil, &err) {
		c.log.Error("consumer stopping: an error no retry fixes; in-flight batches roll back", "err", err)
	}
	c.abort(false)
}

// Kill stops Run as a SIGKILL would: as Abort, and the client stops
// talking to the brokers at once, so the member never leaves the group.
// Its partitions stay assigned to it until the group's session timeout
// expires; only then are they assigned again, and a rebalance begun
// meanwhile waits for that. Kill is safe to call at any time, more than
// once, and concurrently with Run.
func (c *Consumer) Kill() {
	c.abort(true)
}

func (c *Consumer) abort(kill bool) {
	c.aborting.Store(true)
	if kill {
		c.killed.Store(true)
	}
	c.mu.Lock()
	cancelClient, cancelHard, cancelRun := c.cancelClient, c.cancelHard, c.cancelRun
	c.mu.Unlock()
	if kill && cancelClient != nil {
		cancelClient() // first: no request, no leave, goes out once the workers stop
	}
	if cancelHard != nil {
		cancelHard()
		cancelRun()
	}
}

// ErrNotStarted is what Ready returns before Run has asked the brokers.
var ErrNotStarted = errors.New("kafka: not connected yet")

// Ready returns nil when the brokers answered the member's last check
// (every few seconds while Run runs), else why not.
func (c *Consumer) Ready() error {
	if p := c.ready.Load(); p != nil {
		return *p
	}
	return ErrNotStarted
}

// PartitionLag is how far one assigned partition's worker is behind the
// partition's high watermark, as of the last fetch that brought records,
// or else as of the assignment: a partition with nothing to read has lag
// 0.
type PartitionLag struct {
	Topic     string
	Partition int32
	Lag       int64
}

// Lag returns the lag of every partition assigned now that has a worker
// and a known high watermark (unknown only when the brokers did not give
// the log's bounds at assignment and no records came since). A partition
// revoked or lost is no longer in it.
func (c *Consumer) Lag() []PartitionLag {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]PartitionLag, 0, len(c.parts))
	for k, p := range c.parts {
		if p.w == nil || p.hw < 0 {
			continue
		}
		next := p.w.next.Load()
		if next < 0 { // nothing read yet: the worker starts at the log start
			next = p.start
		}
		out = append(out, PartitionLag{Topic: k.topic, Partition: k.partition, Lag: max(0, p.hw-next)})
	}
	return out
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	qr, qb := c.queued()
	return Stats{
		QueuedRecords: qr, QueuedBytes: qb,
		RecordsConsumed: s.records.Load(), RecordsFetched: s.fetched.Load(), Batches: s.batches.Load(), Applied: s.applied.Load(),
		SkippedLRU: s.skippedLRU.Load(), SkippedPostgres: s.skippedPG.Load(), DeadLetters: s.dead.Load(),
		DeadLettersPublished: s.published.Load(), Fenced: s.fenced.Load(), Retries: s.retries.Load(),
		OffsetsOutOfRange: s.outOfRange.Load(), Assigned: s.assigned.Load(), Revoked: s.revoked.Load(),
		Lost: s.lost.Load(), Workers: s.workers.Load(), Retrying: s.retrying.Load(),
		Conflicts: s.conflicts.Load(), OffsetsDeferred: s.deferred.Load(),
	}
}

// queued sums the records waiting in the workers' queues, and their
// values' bytes.
func (c *Consumer) queued() (records, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.parts {
		if p.w == nil {
			continue
		}
		p.w.mu.Lock()
		records += int64(len(p.w.queue))
		bytes += int64(p.w.qbytes)
		p.w.mu.Unlock()
	}
	return records, bytes
}

// Run joins the group and processes records until ctx is canceled, then
// drains: in-flight batches finish within DrainTimeout (what is left is
// aborted), marked offsets are committed, and the member leaves the group.
// Brokers that do not answer are waited for (Ready says why), never a
// reason to return. Run returns only after every goroutine it started has
// exited. It returns an error only if the Kafka client cannot be created
// from the options; ErrInstanceFenced (wrapped) when another member
// took this one's InstanceID under the classic protocol; or, when the
// schema registry refuses the credentials, that error (registry.IsAuth
// holds for it): Run then stops as Abort does — nothing of the batch at
// hand is written. A canceled ctx, Abort or Kill is a clean stop and
// returns nil.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return errors.New("processor: Run called twice")
	}
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	c.mu.Lock()
	c.hard, c.cancelHard, c.cancelRun = hard, cancelHard, cancelRun
	c.mu.Unlock()
	if c.aborting.Load() {
		return nil
	}

	// Kill cancels the client's context: every request in flight ends,
	// and the leave that Close would send never goes out. It comes last,
	// over any kgo.WithContext in KafkaOptions.
	clientCtx, cancelClient := context.WithCancel(context.Background())
	defer cancelClient()
	c.mu.Lock()
	c.cancelClient = cancelClient
	c.mu.Unlock()
	if c.killed.Load() {
		cancelClient()
	}
	opts := append(append(c.clientOptions(), c.cfg.KafkaOptions...), kgo.WithContext(clientCtx))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	c.mu.Lock()
	c.cl = cl
	c.mu.Unlock()
	close(c.clientSet)
	c.log.Info("consumer starting", "group", c.cfg.Group, "topics", c.cfg.Topics, "client_id", c.cfg.ClientID, "brokers", c.cfg.Brokers)

	// Background work owned by Run: the readiness check and the
	// dead-letter publisher. Both stop before the client closes.
	bg, stopBG := context.WithCancel(hard)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.watchBrokers(bg, cl) }()
	if c.cfg.DeadLetterTopic != "" {
		wg.Add(1)
		go func() { defer wg.Done(); c.publishDeadLetters(bg, cl) }()
	}
	if c.cfg.DedupHorizon > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); c.checkHorizon(bg, cl) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); c.checkProtocol(bg, cl) }()

	c.poll(runCtx, cl)

	c.shutdown(cl)
	stopBG()
	wg.Wait()
	cl.Close()
	if err := c.fencedBy.Load(); err != nil {
		c.ready.Store(err) // not ready any more, and why
		return *err        // logged when it happened
	}
	if c.aborting.Load() {
		if c.killed.Load() {
			c.log.Warn("consumer killed: in-flight batches rolled back, no Kafka offset committed, the group not left", "group", c.cfg.Group)
		} else {
			c.log.Warn("consumer aborted: in-flight batches rolled back, no Kafka offset committed", "group", c.cfg.Group)
		}
	} else {
		c.log.Info("consumer stopped", "group", c.cfg.Group)
	}
	if p := c.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *Consumer) clientOptions() []kgo.Opt {
	return append([]kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ClientID(c.cfg.ClientID),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.FetchMaxBytes(int32(c.cfg.FetchMaxBytes)),
		kgo.FetchMaxPartitionBytes(int32(c.cfg.FetchMaxPartitionBytes)),
		kgo.BlockRebalanceOnPoll(),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(c.cfg.CommitInterval),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		kgo.RebalanceTimeout(c.cfg.RebalanceTimeout),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.AdjustFetchOffsetsFn(c.adjust),
		kgo.WithHooks(fetchCounter{&c.stats.fetched}),
		kgo.RecordDeliveryTimeout(c.cfg.ProduceTimeout),
		kgo.WithLogger(kgoLogger{c.log, &c.repeats}),
	}, c.protocolOptions()...)
}

// fetchMaxWait is how long the broker may hold a fetch open waiting for
// data (the Java consumer's fetch.max.wait.ms, 500ms; franz-go's default
// is 5s). A partition resumed after a full queue is only fetched again by
// the next request, so this bounds how long a resumed partition sits idle
// behind a long poll of the member's partitions that have nothing new —
// and a partition far behind while the member's others are caught up
// (after a rebalance or a crash) pauses and resumes at every high water:
// at 500ms it caught up at ~7 k records/s, a high water per long poll
// (benchmarks/PROFILE.md). The cost is an empty fetch per broker every
// 100ms from a member with nothing to read.
const fetchMaxWait = 100 * time.Millisecond

// pollWait bounds one poll, so the loop also takes fenced
// partitions again when nothing arrives.
const pollWait = 500 * time.Millisecond

// poll is the poll loop. It never blocks on a worker: records are queued
// to their partition's worker, and a partition whose queue is full is
// paused (its backlog stays in Kafka) until the worker catches up.
//
// Each poll takes everything franz-go has buffered. Taking less would
// leave the rest of a response buffered, and franz-go drops a paused
// partition's buffered records when it is next polled, to fetch (and
// decompress) them again after it resumes: with a poll of a few batches
// and fetches of a megabyte a partition, a backlog was decoded five times
// over (TestBacklogIsFetchedOnce). What it costs is memory: a queue grows
// past its high water by one decompressed share ("Memory" in the package
// doc).
func (c *Consumer) poll(ctx context.Context, cl *kgo.Client) {
	readdedAt := map[string]time.Time{} // when each topic was last purged and added again
	for {
		pctx, cancel := context.WithTimeout(ctx, pollWait)
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return
		}
		var gone []string // topics whose id the brokers no longer know
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if errors.Is(err, kerr.UnknownTopicID) && !slices.Contains(gone, topic) {
				gone = append(gone, topic)
			}
			// Said once per repeatWindow per partition and error: a
			// deleted or refused topic fails every poll.
			if ok, held := c.repeats.allow(fmt.Sprint("fetch", topic, partition, err), time.Now()); ok {
				c.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err, "repeated", held)
			}
		})
		fetches.EachPartition(c.route)
		c.retakeDue(ctx, cl)
		c.readd(cl, gone, readdedAt)
		cl.AllowRebalance()
	}
}

// readdEvery is how often, at most, one topic is purged from the client
// and added again (readd): each time costs the group a rebalance, and the
// fetches in flight as it happens may still fail with the old id.
const readdEvery = 10 * time.Second

// readd purges from the client, and adds again, each consumed topic of
// gone: topics whose fetches fail with UNKNOWN_TOPIC_ID, which the brokers
// answer once the topic the client knows (by its Kafka topic id) is
// deleted — recreated under the same name or not yet. franz-go keeps a
// topic's first id for the client's life and fails every fetch of a new
// one until the topic is purged and added again; then it learns the
// topic as new, by its name: a recreated topic is assigned again, and a
// topic not yet recreated is waited for, as one not created yet is.
//
// First the topic's workers stop, as on a revoke: the batch each is
// writing finishes (or is given up after DrainTimeout) under the old id
// and the old lease — records of the old topic, harmless — and the
// records queued behind it, which no member can read any more, are
// dropped. readd commits no Kafka offset (a revoke would): an offset of
// the old topic committed by name could land on the new one; franz-go
// drops the old topic's marks once it has seen it recreated, and the
// brokers refuse them for a deleted one. Whatever Kafka holds, the offset
// stored in Postgres, with its topic id, decides: when the group assigns
// the topic's partitions again, adjust takes each with a new lease, and
// an offset stored under the old topic id starts the partition from its
// log start, as any recreated topic's does; a partition with no stored
// offset (one the old topic did not have) starts from the log start too,
// unless the group has an offset committed for it in Kafka. Each topic is re-added at most once per
// readdEvery. Called by the poll loop, before it allows a rebalance, so
// stopping workers cannot race a revoke.
func (c *Consumer) readd(cl *kgo.Client, gone []string, readdedAt map[string]time.Time) {
	now := time.Now()
	var topics []string
	for _, topic := range gone {
		if !slices.Contains(c.cfg.Topics, topic) || now.Sub(readdedAt[topic]) < readdEvery {
			continue
		}
		readdedAt[topic] = now
		topics = append(topics, topic)
	}
	if len(topics) == 0 {
		return
	}
	stop := map[string][]int32{}
	c.mu.Lock()
	for k := range c.parts {
		if slices.Contains(topics, k.topic) {
			stop[k.topic] = append(stop[k.topic], k.partition)
		}
	}
	for _, topic := range topics {
		delete(c.topicIDs, topic)
	}
	c.mu.Unlock()
	for _, topic := range topics {
		c.log.Warn("consumed topic deleted, perhaps recreated under the same name (its topic id is unknown to the brokers): "+
			"its partitions' workers stop, and the topic is consumed again as new, a recreated topic from its start",
			"topic", topic, "partitions", stop[topic])
	}
	c.stats.revoked.Add(int64(c.stop(stop, c.aborting.Load())))
	cl.PurgeTopicsFromClient(topics...)
	cl.AddConsumeTopics(topics...)
}

// route hands one partition's fetched records to its worker.
func (c *Consumer) route(p kgo.FetchTopicPartition) {
	if len(p.Records) == 0 {
		return
	}
	k := tp{p.Topic, p.Partition}
	c.mu.Lock()
	part := c.parts[k]
	var w *worker
	if part != nil {
		part.hw = p.HighWatermark
		w = part.w
	}
	c.mu.Unlock()
	switch {
	case part == nil:
		return // revoked since the fetch; the next owner reads them
	case w == nil:
		// Fenced or out of range: nothing may be written from these.
		c.cl.PauseFetchPartitions(map[string][]int32{k.topic: {k.partition}})
		return
	}
	c.stats.records.Add(int64(len(p.Records)))
	w.enqueue(p.Records)
}

// assigned is called before the offsets of new partitions are fetched;
// the partitions are taken in adjust, once their Kafka offsets are known.
func (c *Consumer) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	for topic, parts := range assigned {
		if len(parts) > 0 {
			c.log.Info("partitions assigned", "topic", topic, "partitions", parts)
		}
	}
}

// adjust takes the newly assigned partitions in Postgres (a new epoch
// each, which fences any earlier owner), decides where each starts — the
// offset stored in Postgres whenever there is one, whatever Kafka has
// committed — and starts their workers. It waits for Postgres as long as
// the assignment lasts.
func (c *Consumer) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	select {
	case <-c.clientSet: // c.cl is used below
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for _, topic := range slices.Sorted(maps.Keys(offsets)) {
		parts := offsets[topic]
		ps := slices.Sorted(maps.Keys(parts))
		// A topic purged and added again (readd) can be assigned again
		// with no revoke between: a worker still running for one of
		// these partitions stops first.
		c.stats.revoked.Add(int64(c.stop(map[string][]int32{topic: ps}, c.aborting.Load())))
		id := c.topicID(ctx, topic)
		leases, err := c.take(ctx, topic, ps)
		if err != nil {
			return nil, err // the assignment is being revoked
		}
		bounds := c.logBounds(ctx, topic, leases)
		for _, p := range ps {
			c.start(topic, p, leases[p], parts, bounds[p], id)
		}
	}
	return offsets, nil
}

// start decides where partition p of topic starts, sets it in parts, and
// starts its worker (or leaves it paused when its stored offset is out of
// range and the policy says so).
func (c *Consumer) start(topic string, p int32, l sink.Lease, parts map[int32]kgo.Offset, b logBounds, id uuid.NullUUID) {
	k := tp{topic, p}
	next := int64(-1)
	paused := false
	if s := l.NextOffset; s >= 0 {
		next = s
		recreated := id.Valid && l.TopicID.Valid && id.UUID != l.TopicID.UUID
		if recreated || b.known && (s < b.start || s > b.end) {
			c.stats.outOfRange.Add(1)
			where := "below the log start: the records in between were deleted by retention and are not applied"
			switch {
			case recreated:
				where = "of a topic deleted since and recreated under the same name (its topic id changed from " +
					l.TopicID.UUID.String() + " to " + id.UUID.String() + ")"
			case s > b.end:
				where = "beyond the log end: the topic was probably deleted and recreated"
			}
			action := "consuming from the log start (kafka.offset_out_of_range: earliest)"
			if c.cfg.OffsetOutOfRange == PauseOnOutOfRange {
				action = "the partition stays paused (kafka.offset_out_of_range: pause) until its offsets are reset"
				paused = true
			} else {
				next = b.start // 0 when the bounds are unknown: the log start of a new topic
			}
			c.log.Error("stored offset is "+where+"; "+action, "topic", topic, "partition", p,
				"stored_offset", s, "log_start", b.start, "log_end", b.end)
		}
		committed := parts[p].EpochOffset().Offset
		parts[p] = kgo.NewOffset().At(next).WithEpoch(-1)
		if recreated && !b.known && !paused {
			parts[p] = kgo.NewOffset().AtStart()
		}
		if next != committed {
			c.log.Info("resuming from the offset stored in postgres", "topic", topic, "partition", p,
				"offset", next, "kafka_committed", committed)
		}
	} else if off := parts[p].EpochOffset().Offset; off >= 0 {
		next = off
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	part := &partition{hw: -1}
	if b.known {
		part.hw, part.start = b.end, b.start
	}
	c.parts[k] = part
	c.stats.assigned.Add(1)
	if paused {
		c.cl.PauseFetchPartitions(map[string][]int32{topic: {p}})
		return
	}
	part.w = c.newWorker(k, l, next)
	c.cl.ResumeFetchPartitions(map[string][]int32{topic: {p}})
}

// topicID returns topic's Kafka topic id, remembering it for the workers
// (they store it with each batch's offset); not Valid when the brokers do
// not answer within a few attempts (a topic just recreated can be unknown
// to some for a moment) or have no topic ids.
func (c *Consumer) topicID(ctx context.Context, topic string) uuid.NullUUID {
	var id uuid.NullUUID
	var err error
attempts:
	for attempt := 1; ; attempt++ {
		id, err = c.readTopicID(ctx, topic)
		if id.Valid || errors.Is(err, errNoTopicIDs) || attempt == 3 {
			break
		}
		select {
		case <-ctx.Done():
			break attempts
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	if !id.Valid {
		c.log.Warn("read the topic's id; a topic recreated under the same name is only detected by its offsets", "topic", topic, "err", err)
	}
	c.mu.Lock()
	c.topicIDs[topic] = id
	c.mu.Unlock()
	return id
}

// errNoTopicIDs: the brokers answer with no topic ids (Kafka before 2.8).
var errNoTopicIDs = errors.New("the brokers have no topic ids")

// readTopicID asks the brokers for topic's Kafka topic id, once.
func (c *Consumer) readTopicID(ctx context.Context, topic string) (uuid.NullUUID, error) {
	tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	details, err := kadm.NewClient(c.cl).ListTopics(tctx, topic)
	if err != nil {
		return uuid.NullUUID{}, err
	}
	d, ok := details[topic]
	switch {
	case !ok:
		return uuid.NullUUID{}, errors.New("not in the brokers' metadata")
	case d.Err != nil:
		return uuid.NullUUID{}, d.Err
	case d.ID == (kadm.TopicID{}):
		return uuid.NullUUID{}, errNoTopicIDs
	}
	return uuid.NullUUID{UUID: uuid.UUID(d.ID), Valid: true}, nil
}

// take takes partitions in Postgres, retrying with backoff until it
// succeeds or ctx ends.
func (c *Consumer) take(ctx context.Context, topic string, ps []int32) (map[int32]sink.Lease, error) {
	backoff := c.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		leases, err := c.writer.Take(tctx, topic, ps)
		cancel()
		if err == nil {
			return leases, nil
		}
		c.log.Warn("take partitions in postgres; waiting for it", "topic", topic, "partitions", ps, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, c.cfg.MaxRetryBackoff)
	}
}

// retakeDue takes again, after a fence, the partitions still assigned to
// this member: by then a zombie that fenced this member has learned from
// the group that it lost them. It runs in the poll loop, before
// AllowRebalance, so seeking cannot race a revoke.
func (c *Consumer) retakeDue(ctx context.Context, cl *kgo.Client) {
	now := time.Now()
	var due []tp
	c.mu.Lock()
	for k, p := range c.parts {
		if p.w == nil && !p.retakeAt.IsZero() && now.After(p.retakeAt) {
			due = append(due, k)
		}
	}
	c.mu.Unlock()
	for _, k := range due {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		leases, err := c.writer.Take(tctx, k.topic, []int32{k.partition})
		var start int64
		if err == nil {
			start, err = c.restartOffset(tctx, cl, k, leases[k.partition])
		}
		cancel()
		c.mu.Lock()
		part := c.parts[k]
		if part == nil || part.w != nil {
			c.mu.Unlock()
			continue // revoked meanwhile
		}
		if err != nil {
			part.retakeAt = time.Now().Add(c.cfg.MaxRetryBackoff)
			c.mu.Unlock()
			c.log.Warn("take partition again after a fence", "topic", k.topic, "partition", k.partition, "err", err)
			continue
		}
		part.retakeAt = time.Time{}
		part.w = c.newWorker(k, leases[k.partition], start)
		c.mu.Unlock()
		cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{k.topic: {k.partition: {Epoch: -1, Offset: start}}})
		cl.ResumeFetchPartitions(map[string][]int32{k.topic: {k.partition}})
		c.log.Info("partition taken again after a fence", "topic", k.topic, "partition", k.partition,
			"offset", start, "epoch", leases[k.partition].Epoch)
	}
}

// revoked stops the workers of revoked partitions (each finishes its
// in-flight batch within DrainTimeout, or is aborted), then commits the
// marked offsets before the rebalance goes on.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	n := c.stop(revoked, c.aborting.Load())
	c.stats.revoked.Add(int64(n))
	if c.aborting.Load() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	_ = c.commit(cctx, cl, "revoke") // logged by commitDone
	if n > 0 {
		c.log.Info("partitions revoked", "partitions", revoked)
	}
}

func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	n := c.stop(lost, true)
	c.stats.lost.Add(int64(n))
	if n > 0 {
		c.log.Warn("partitions lost; in-flight batches aborted, nothing committed", "partitions", lost)
	}
}

// commit synchronously commits the marked offsets, in a span of its own.
func (c *Consumer) commit(ctx context.Context, cl *kgo.Client, why string) error {
	ctx, span := c.tracer.Start(ctx, "kafka.commit_offsets", trace.WithAttributes(attribute.String("onceflow.reason", why)))
	defer span.End()
	err := c.commitMarked(ctx, cl)
	if err != nil {
		span.RecordError(err)
	}
	return err
}

// stop forgets the given partitions and stops their workers; see
// stopWorkers.
func (c *Consumer) stop(parts map[string][]int32, abort bool) int {
	c.mu.Lock()
	var ws []*worker
	n := 0
	for topic, ps := range parts {
		for _, p := range ps {
			k := tp{topic, p}
			if part := c.parts[k]; part != nil {
				delete(c.parts, k)
				n++
				if part.w != nil {
					ws = append(ws, part.w)
				}
			}
		}
	}
	c.mu.Unlock()
	c.stopWorkers(ws, abort)
	return n
}

// stopWorkers stops workers and waits for them. Draining, each finishes the
// batch it is writing (none is started) until DrainTimeout, after which
// the rest are aborted; aborting, or after Abort, in-flight transactions
// are canceled at once.
func (c *Consumer) stopWorkers(ws []*worker, abort bool) {
	for _, w := range ws {
		if abort {
			w.cancel()
		}
		close(w.quit)
	}
	deadline := time.NewTimer(c.cfg.DrainTimeout)
	defer deadline.Stop()
	for _, w := range ws {
		select {
		case <-w.done:
		case <-deadline.C:
			c.log.Warn("drain timeout: aborting the batches still in flight", "drain_timeout", c.cfg.DrainTimeout)
			for _, w := range ws {
				w.cancel()
			}
			<-w.done
		case <-c.hard.Done(): // Abort
			<-w.done
		}
	}
}

// shutdown ends Run's work after the poll loop: drain (or abort) every
// worker, commit the marked offsets and leave the group, each bounded.
func (c *Consumer) shutdown(cl *kgo.Client) {
	c.mu.Lock()
	ws := make([]*worker, 0, len(c.parts))
	for k, p := range c.parts {
		delete(c.parts, k)
		if p.w != nil {
			ws = append(ws, p.w)
		}
	}
	c.mu.Unlock()
	c.stopWorkers(ws, c.aborting.Load())
	if c.aborting.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(c.hard, c.cfg.CallTimeout)
	defer cancel()
	_ = c.commit(ctx, cl, "shutdown") // logged by commitDone
	c.leaveGroup(ctx, cl)
}

// watchBrokers asks the brokers every few seconds whether they answer and
// publishes the answer through Ready, logging each change; when they
// answer, it checks the consumed topics too (checkTopics).
func (c *Consumer) watchBrokers(ctx context.Context, cl *kgo.Client) {
	const every = 3 * time.Second
	var last error = ErrNotStarted
	topics := map[string]string{}
	for {
		pctx, cancel := context.WithTimeout(ctx, every)
		err := cl.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = fmt.Errorf("kafka brokers %v do not answer: %w", c.cfg.Brokers, err)
		}
		c.ready.Store(&err)
		switch {
		case err != nil && (last == nil || errors.Is(last, ErrNotStarted)):
			c.log.Warn("waiting for the kafka brokers", "brokers", c.cfg.Brokers, "err", err)
		case err == nil && last != nil:
			c.log.Info("kafka brokers answer", "brokers", c.cfg.Brokers)
		}
		last = err
		if err == nil {
			c.checkTopics(ctx, cl, topics)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// checkTopics asks the brokers about the consumed topics and logs each
// change of what they say, once: a topic they do not have (a typo, or one
// not created yet — the member consumes it once it exists, and says so),
// or whose metadata they refuse (an ACL). state holds, per topic, what
// was said last ("" for a topic that exists).
//
// The metadata is asked for as is (cached as kadm would), not through
// kadm's ListTopics, which fails as a whole when one topic is refused: the
// refused topic, and any missing one beside it, would never be said.
func (c *Consumer) checkTopics(ctx context.Context, cl *kgo.Client, state map[string]string) {
	req := kmsg.NewPtrMetadataRequest()
	for _, topic := range c.cfg.Topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
	}
	tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	resp, err := cl.RequestCachedMetadata(tctx, req, 0)
	cancel()
	if err != nil {
		return // asked again next time
	}
	errs := make(map[string]error, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic != nil {
			errs[*t.Topic] = kerr.ErrorForCode(t.ErrorCode)
		}
	}
	for _, topic := range c.cfg.Topics {
		now := ""
		if terr, ok := errs[topic]; !ok || errors.Is(terr, kerr.UnknownTopicOrPartition) {
			now = "missing"
		} else if terr != nil {
			now = terr.Error()
		}
		was, seen := state[topic]
		state[topic] = now
		switch {
		case now == was:
		case now == "missing":
			c.log.Warn("consumed topic does not exist; the member waits for it to be created", "topic", topic, "brokers", c.cfg.Brokers)
		case now != "":
			c.log.Warn("the brokers refuse the consumed topic's metadata", "topic", topic, "err", now)
		case seen:
			c.log.Info("consumed topic exists now", "topic", topic)
		}
	}
}

// kgoLogger sends franz-go's own logs (warnings and errors) to slog, a
// line said again within repeatWindow held back (a deleted topic makes
// franz-go fail every commit, per partition).
type kgoLogger struct {
	log  *slog.Logger
	seen *repeats
}

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if msg == kgoCommitRefused {
		return // said by commitDone, an epoch refusal once
	}
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	ok, held := l.seen.allow(fmt.Sprint(level, msg, keyvals), time.Now())
	if !ok {
		return
	}
	if held > 0 {
		keyvals = append(keyvals, "repeated", held)
	}
	l.log.Log(context.Background(), lv, "kafka: "+msg, keyvals...)
}

// fetchCounter counts the records franz-go decodes from fetch responses
// (Stats.RecordsFetched).
type fetchCounter struct{ n *atomic.Int64 }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (f fetchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.n.Add(int64(m.NumRecords))
}
