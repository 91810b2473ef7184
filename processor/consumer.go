// The Consumer: the Writer it writes through, its Stats, New, Run (the
// client, the background work, the poll loop, shutdown), Abort and Kill,
// readiness and lag, and franz-go's logs sent to slog.

package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
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
	// LeaseDeadLetters, MarkDeadLettersPublished and ReleaseDeadLetters
	// feed the dead-letter topic from the dead_letters table; see
	// sink.Writer.
	LeaseDeadLetters(ctx context.Context, limit int, lease time.Duration) ([]sink.PendingDeadLetter, error)
	MarkDeadLettersPublished(ctx context.Context, ids []int64, notes []string) error
	ReleaseDeadLetters(ctx context.Context, ids []int64) error
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
	RecordsConsumed int64 // records received from Kafka, duplicates included, transaction markers not
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
	Retrying             int64 // partitions retrying a batch now (PartitionState.Retrying)
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
	// instance id, or the brokers refused its session (protocol.go): Run
	// returns it; refused while the group refuses this
	// member (another live member holds its instance id, or a classic
	// group does not take a consumer-protocol member), until it joins;
	// groupMissing once a consumer-protocol join was answered
	// GROUP_ID_NOT_FOUND (protocol.go).
	commits      commitNotes
	fencedBy     atomic.Pointer[error]
	refused      atomic.Pointer[error]
	groupMissing atomic.Bool

	mu    sync.Mutex
	parts map[tp]*partition // the partitions assigned to this member now
	// clientSet is closed once cl is set: the group may join, and call
	// adjust, before kgo.NewClient has returned.
	clientSet chan struct{}
	// topicIDs are the Kafka ids of the consumed topics as of their last
	// assignment, stored with each batch's offset.
	topicIDs map[string]uuid.NullUUID
	// findings are the last out-of-range stored offset reported per
	// partition (firstFinding).
	findings map[tp]string
	cl       *kgo.Client
	ran      atomic.Bool

	// recreated are the consumed topics the client saw recreated (a new
	// id under a name it holds) and that were not added again since:
	// the poll loop re-adds them (readd). Its own lock: franz-go's
	// logger sets it from the client's goroutines, which must never wait
	// for mu.
	recreatedMu sync.Mutex
	recreated   map[string]bool

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
	hw       int64     // last stable offset at the last fetch, else at assignment; -1 when unknown
	start    int64     // log start at assignment: where a worker with no next offset starts
	fetched  int64     // the offset after the last record fetched for w; 0 before any
	// outOfRange is set while a fetch of w's that the brokers answered
	// OFFSET_OUT_OF_RANGE waits for the watch to read the log's bounds
	// (noteOutOfRange); resetTo, once they are read under
	// ResumeAtLogStart, is the log start the poll loop moves the
	// partition's fetching to (resetDue). -1: none.
	outOfRange bool
	resetTo    int64
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
// (every few seconds while Run runs) and the group admits the member,
// else why not: ErrNotStarted, the brokers' silence, ErrInstanceHeld
// (wrapped) while, under ConsumerProtocol, the broker refuses the member
// because another live member holds its InstanceID, why while a group
// running the classic protocol refuses this ConsumerProtocol member, or
// ErrInstanceFenced (wrapped) once another member took its InstanceID
// under ClassicProtocol and Run returned.
func (c *Consumer) Ready() error {
	p := c.ready.Load()
	switch {
	case p == nil:
		return ErrNotStarted
	case *p != nil:
		return *p
	}
	return c.refusal()
}

// PartitionLag is how far one assigned partition's worker is behind the
// end of what it can read: the partition's last stable offset, as of the
// last fetch that brought records, or else as of the assignment. A
// partition with nothing to read has lag 0. Records are read committed,
// as Kafka's consumer reads them under isolation.level=read_committed
// (and counts its lag): the records of a transaction still open are not
// counted until it ends (with no transactional producer the last stable
// offset is the high watermark), and a transaction's commit or abort
// marker and an aborted transaction's records count as read once the
// worker has passed them.
type PartitionLag struct {
	Topic     string
	Partition int32
	Lag       int64
}

// Lag returns the lag of every partition assigned now with a known high
// watermark (unknown only when the brokers did not give the log's bounds
// at assignment and no records came since) that has a worker, or that
// stays paused because its stored offset was out of range
// (PauseOnOutOfRange): nothing of its log is read, so its lag is the whole
// log, and stays so until an operator resets its offsets. A partition
// fenced, to be taken again in a moment, is not in it; nor is one revoked
// or lost.
func (c *Consumer) Lag() []PartitionLag {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]PartitionLag, 0, len(c.parts))
	for k, p := range c.parts {
		if p.hw < 0 || p.w == nil && !p.retakeAt.IsZero() {
			continue
		}
		next := p.start // paused, or nothing read yet: the log start
		if p.w != nil && p.w.next.Load() >= 0 {
			next = p.w.next.Load()
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
		c.log.Info("consumer aborted before it started: nothing read, nothing written", "group", c.cfg.Group)
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
	c.reclaimInstance(hard, clientCtx)
	// The event id tag comes after KafkaOptions: its hook runs after a
	// tracing hook there has started the record's receive span.
	opts := append(append(c.clientOptions(), c.cfg.KafkaOptions...),
		kgo.WithHooks(eventIDTag{c.cfg.Decode.withDefaults()}), kgo.WithContext(clientCtx))
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
		// Info: the caller asked for it (a fatal error is logged at
		// Error where it happened).
		if c.killed.Load() {
			c.log.Info("consumer killed: in-flight batches rolled back, no Kafka offset committed, the group not left", "group", c.cfg.Group)
		} else {
			c.log.Info("consumer aborted: in-flight batches rolled back, no Kafka offset committed", "group", c.cfg.Group)
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
		kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()),
		// A fetch the brokers answer OFFSET_OUT_OF_RANGE (the log start
		// passed what the member has fetched: retention or DeleteRecords
		// deleted records it had not read) comes back as an error, not
		// reset by the client without a word: the member says it, counts
		// it, and follows kafka.offset_out_of_range (noteOutOfRange).
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		// Read committed, as Kafka's own consumers of transactional
		// producers are told to: the records of an aborted or open
		// transaction are never applied. The control records (a
		// transaction's commit or abort marker) are kept: a worker
		// moves its offset over them (see readPast), as Kafka's
		// consumer moves its position, so a partition whose last
		// record is a marker is caught up, not lagging by one.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.FetchMaxBytes(int32(c.cfg.FetchMaxBytes)),
		kgo.FetchMaxPartitionBytes(int32(c.cfg.FetchMaxPartitionBytes)),
		kgo.BlockRebalanceOnPoll(),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(c.cfg.CommitInterval),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		// Classic only (under KIP-848 the broker sets it): franz-go's
		// fixed 3s is no heartbeat at all within a session of 3s or less.
		kgo.HeartbeatInterval(c.cfg.HeartbeatInterval),
		kgo.RebalanceTimeout(c.cfg.RebalanceTimeout),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.AdjustFetchOffsetsFn(c.adjust),
		kgo.WithHooks(fetchCounter{&c.stats.fetched}),
		kgo.RecordDeliveryTimeout(c.cfg.ProduceTimeout),
		kgo.WithLogger(kgoLogger{c.log, &c.repeats, c.noteRecreated}),
	}, c.protocolOptions()...)
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

// kgoLogger sends franz-go's own logs (warnings and errors) to slog, a
// line said again within repeatWindow held back (a deleted topic makes
// franz-go fail every commit, per partition).
// kgoRetryKeys are the keys franz-go changes at each retry of the same
// failure (a group loop's error count and backoff): a line is the same
// line without them.
var kgoRetryKeys = map[string]bool{"consecutive_errors": true, "backoff": true}

// lastingKeyvals is keyvals without the kgoRetryKeys pairs.
func lastingKeyvals(keyvals []any) []any {
	out := make([]any, 0, len(keyvals))
	for i := 0; i+1 < len(keyvals); i += 2 {
		if k, _ := keyvals[i].(string); !kgoRetryKeys[k] {
			out = append(out, keyvals[i], keyvals[i+1])
		}
	}
	return out
}

type kgoLogger struct {
	log  *slog.Logger
	seen *repeats
	// recreated, if set, is told each topic franz-go says it saw
	// recreated (kgoTopicRecreated).
	recreated func(topic string)
}

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if msg == kgoCommitRefused {
		return // said by commitDone, an epoch refusal once
	}
	if msg == kgoTopicRecreated && l.recreated != nil {
		for i := 0; i+1 < len(keyvals); i += 2 {
			if k, _ := keyvals[i].(string); k == "topic" {
				if topic, ok := keyvals[i+1].(string); ok {
					l.recreated(topic)
				}
			}
		}
	}
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	ok, held := l.seen.allow(fmt.Sprint(level, msg, lastingKeyvals(keyvals)), time.Now())
	if !ok {
		return
	}
	if held > 0 {
		keyvals = append(keyvals, "repeated", held)
	}
	l.log.Log(context.Background(), lv, "kafka: "+msg, keyvals...)
}
