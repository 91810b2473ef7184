package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// maxLinks bounds the producer links of one batch span.
const maxLinks = 128

// exit is why a worker's flush or life ended.
type exit int

const (
	committed exit = iota // the batch committed (flush and write only)
	smaller               // a transaction timed out: write the records again in a smaller batch (write only)
	stopped               // told to stop (revoke, shutdown) while not writing
	fenced                // another writer took the partition
	aborted               // its context was canceled (lost, abort, drain timeout)
)

// worker owns one assigned partition under one lease: it batches that
// partition's records and writes each batch in one transaction. The poll
// loop queues records to it without ever waiting (enqueue); the worker
// pauses the partition's fetching while its queue is full.
//
// Invariant: a worker writes batches in offset order, each starting where
// the previous committed one ended, and once a batch is given up without
// committing (stopped, fenced, aborted) the worker writes nothing more: it
// exits, and its queue is dropped. So the stored offset only ever advances
// over records whose effects or dead letters are in the same transaction.
// A new worker (a new lease, after a new assignment or a retake) starts
// again from the offset stored in Postgres — which can be behind the last
// committed batch by batches that wrote nothing and deferred their offset
// (those that closed within offsetEvery of the last store), when the worker
// ended in a crash or an abort (told to stop, it stores that offset as it
// exits): those are read again and found applied.
type worker struct {
	c       *Consumer
	key     tp
	epoch   int64         // the lease this worker writes under
	fence   int64         // the offset stored in Postgres as of the last commit (-1: none); worker goroutine only
	topicID uuid.NullUUID // the topic's Kafka id, stored with each batch's offset; not Valid when unknown

	next     atomic.Int64 // records below it are written: dropped
	retrying bool         // worker goroutine only
	// inflight is the first record of the batch being written, nil
	// between batches; retryingNow mirrors retrying. Both are read by
	// Partitions.
	inflight    atomic.Pointer[kgo.Record]
	retryingNow atomic.Bool
	// storedAt is when fence was stored (or the lease taken), and
	// wroteNothing whether the last batch, at its first attempt, found
	// every event applied: with more records queued, the next batch may
	// defer its offset (sink.Batch.DeferOffset) if offsetEvery has not
	// passed when it closes. Worker goroutine only.
	storedAt     time.Time
	wroteNothing bool
	// size is how many records, at most, a batch takes from those in
	// hand: BatchMaxRecords, halved after a transaction times out (down to
	// one), twice the records of a prefix the Writer committed when it
	// ran short of time isolating culprits, and doubled back (up to
	// BatchMaxRecords) after growAfter batches in a row committed whole;
	// whole counts those. Worker goroutine only.
	size  int
	whole int
	// dense: the last batch committed a prefix that was mostly dead
	// letters, so the next one isolates from the start
	// (sink.Batch.Isolate). Worker goroutine only.
	dense    bool
	deferred *kgo.Record  // the last record of the last batch that deferred its offset, while none has stored since
	events   []sink.Event // the last batch's events, cleared: reused by the next batch; worker goroutine only

	mu      sync.Mutex // guards the queue; the poll loop appends, the worker takes
	queue   []*kgo.Record
	qbytes  int
	firstAt time.Time // when the oldest queued record arrived
	paused  bool      // the partition's fetching is paused because the queue is full

	wake chan struct{} // size 1: records were queued
	quit chan struct{} // closed to stop the worker
	done chan struct{} // closed when the worker has exited

	ctx    context.Context // canceled to abort the in-flight transaction
	cancel context.CancelFunc
}

// newWorker starts the worker of partition k under lease l, consuming from
// next (-1: unknown, the first record fetched). Call with c.mu held.
func (c *Consumer) newWorker(k tp, l sink.Lease, next int64) *worker {
	ctx, cancel := context.WithCancel(c.hard)
	w := &worker{
		c: c, key: k, epoch: l.Epoch, fence: l.NextOffset, topicID: c.topicIDs[k.topic], storedAt: time.Now(),
		size: c.cfg.BatchMaxRecords,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		ctx: ctx, cancel: cancel,
	}
	w.next.Store(max(next, 0))
	c.stats.workers.Add(1)
	go w.run()
	return w
}

func (w *worker) run() {
	defer close(w.done)
	defer w.cancel()
	defer w.c.stats.workers.Add(-1)
	if w.loop() == fenced {
		w.c.fenced(w)
	}
}

// loop writes batches until the worker is stopped or gives a batch up.
func (w *worker) loop() exit {
	for {
		recs, ok := w.nextBatch()
		if !ok {
			w.storeDeferred()
			return stopped
		}
		if why := w.flush(recs); why != committed {
			if why == stopped { // told to stop while waiting to retry
				w.storeDeferred()
			}
			return why
		}
	}
}

// storeDeferred, as a worker told to stop exits, stores the offset its
// last batches deferred, if they did: a transaction of the offset alone
// (an empty batch: the offset moves over the deferred records only, which
// end at or before any batch given up after them), bounded as the drain
// is, then the Kafka mark. So a revoke or a shutdown leaves the next owner
// nothing to read again. It is one try: a failure (fenced, Postgres away,
// the drain timing out) leaves those records to the next owner, who finds
// them applied; an abort or a lost partition does not try.
func (w *worker) storeDeferred() {
	if w.deferred == nil || w.c.aborting.Load() || w.ctx.Err() != nil {
		return
	}
	last := w.deferred
	b := &sink.Batch{Topic: w.key.topic, Partition: w.key.partition, Epoch: w.epoch, Fence: w.fence,
		NextOffset: last.Offset + 1, TopicID: w.topicID}
	ctx, span := w.c.tracer.Start(w.ctx, "onceflow.store_deferred_offset", trace.WithAttributes(
		attribute.String("messaging.destination.name", b.Topic),
		attribute.Int("messaging.destination.partition.id", int(b.Partition)),
		attribute.Int64("onceflow.next_offset", b.NextOffset), attribute.Int64("onceflow.epoch", b.Epoch)))
	defer span.End()
	if _, err := w.c.writer.Write(ctx, b); err != nil {
		span.RecordError(err)
		w.c.log.Info("could not store the offset deferred by the last batches as the worker stops; the next owner reads them again",
			"topic", b.Topic, "partition", b.Partition, "fence", b.Fence, "next_offset", b.NextOffset, "err", err)
		return
	}
	w.fence, w.deferred = b.NextOffset, nil
	if !w.c.aborting.Load() {
		w.c.cl.MarkCommitRecords(last)
	}
}

// stopping reports whether the worker is told to stop.
func (w *worker) stopping() bool {
	select {
	case <-w.quit:
		return true
	default:
		return false
	}
}

// highWater is the queue size, in records and in bytes, at which the
// partition is paused; it is resumed when the queue is back under half.
func (w *worker) highWater() (int, int) {
	return max(2*w.c.cfg.BatchMaxRecords, minHighWater), 2 * w.c.cfg.BatchMaxBytes
}

// minHighWater keeps small batches (down to one record) from pausing and
// resuming the partition's fetching on every batch; the queue's bytes stay
// bounded by twice BatchMaxBytes whatever the record count.
const minHighWater = 256

// enqueue queues records fetched for the partition. It never blocks on the
// worker; it pauses the partition's fetching when the queue is full.
// Called by the poll loop.
func (w *worker) enqueue(recs []*kgo.Record) {
	maxRecs, maxBytes := w.highWater()
	next := w.next.Load()
	w.mu.Lock()
	for _, r := range recs {
		if r.Offset < next {
			continue // written already
		}
		if len(w.queue) == 0 {
			w.firstAt = time.Now()
		}
		w.queue = append(w.queue, r)
		w.qbytes += len(r.Value)
	}
	if !w.paused && (len(w.queue) >= maxRecs || w.qbytes >= maxBytes) {
		w.paused = true
		w.c.cl.PauseFetchPartitions(map[string][]int32{w.key.topic: {w.key.partition}})
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// nextBatch waits until a batch is due — BatchMaxRecords or BatchMaxBytes
// queued, or BatchLinger since the oldest queued record — and takes it
// from the queue. It reports false when the worker is told to stop, even
// with batches due: a stopping worker starts none (what is queued is the
// next owner's to read), so a revoke or a shutdown waits for the batch in
// flight only.
func (w *worker) nextBatch() ([]*kgo.Record, bool) {
	cfg := &w.c.cfg
	for {
		select {
		case <-w.quit:
			return nil, false
		default:
		}
		w.mu.Lock()
		n, size, first := len(w.queue), w.qbytes, w.firstAt
		w.mu.Unlock()
		wait := cfg.BatchLinger - time.Since(first)
		if n > 0 && (n >= cfg.BatchMaxRecords || size >= cfg.BatchMaxBytes || wait <= 0) {
			return w.take(), true
		}
		var linger <-chan time.Time
		var t *time.Timer
		if n > 0 {
			t = time.NewTimer(wait)
			linger = t.C
		}
		select {
		case <-w.quit:
			if t != nil {
				t.Stop()
			}
			return nil, false
		case <-w.wake:
		case <-linger:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// take removes one batch from the head of the queue, resuming the
// partition's fetching once the queue is back under half its high water.
func (w *worker) take() []*kgo.Record {
	cfg := &w.c.cfg
	maxRecs, maxBytes := w.highWater()
	w.mu.Lock()
	defer w.mu.Unlock()
	n, size := 0, 0
	for n < len(w.queue) && n < cfg.BatchMaxRecords && (n == 0 || size+len(w.queue[n].Value) <= cfg.BatchMaxBytes) {
		size += len(w.queue[n].Value)
		n++
	}
	batch := w.queue[:n:n]
	if n > 0 {
		w.inflight.Store(batch[0])
	}
	w.queue = w.queue[n:]
	w.qbytes -= size
	if len(w.queue) == 0 {
		w.queue = nil
	} else {
		w.firstAt = time.Now()
	}
	if w.paused && len(w.queue) < maxRecs/2 && w.qbytes < maxBytes/2 {
		w.paused = false
		w.c.cl.ResumeFetchPartitions(map[string][]int32{w.key.topic: {w.key.partition}})
	}
	return batch
}

// flush writes recs, in order, until all are committed or the worker must
// give up: the worker is told to stop while waiting to retry, or between
// two of the batches below (stopped), the partition was taken by another
// writer (fenced), or the transaction's context was canceled (aborted).
// It writes them as one batch when it can, and as several when the
// Writer commits a prefix of a batch whose isolation of culprits runs
// long (sink.Batch.AllowPrefix) or when a transaction times out (see
// write). Data errors never reach here: the Writer isolates them into
// dead letters. Only after a batch's COMMIT is its last record marked for
// the Kafka commit; records given up are written by no one here, and the
// next owner reads them from the offset stored.
func (w *worker) flush(recs []*kgo.Record) exit {
	defer w.setRetrying(false)
	retry := false
	for len(recs) > 0 {
		n, why := w.write(recs, retry)
		switch why {
		case committed:
			recs, retry = recs[n:], false
			if len(recs) > 0 {
				w.inflight.Store(recs[0]) // a prefix committed: the rest is in flight
			}
			if len(recs) > 0 && w.stopping() {
				// As nextBatch: a stopping worker starts no batch; the
				// records left are the next owner's to read.
				return stopped
			}
		case smaller:
			retry = true
		default:
			return why
		}
	}
	return committed
}

// write decodes the first records of recs, at most size of them, into a
// batch and writes it, retrying transient and unknown failures with capped
// backoff. It returns how many records of recs are committed (at least
// one) with committed, or why it gave up. A transaction that timed out
// says that the batch holds more work than a transaction has time for: the
// worker halves its batch size (down to one record) and returns smaller
// after the backoff, for flush to write the same records again in a
// smaller batch; the size grows back as batches commit whole (grow).
// Nothing is dead-lettered because of a timeout. retry says that these
// records were in a batch that failed: the batch does not defer its
// offset.
//
// An attempt's COMMIT may have gone through with its outcome lost: then a
// later attempt is fenced by the worker's own epoch, with the stored
// offset past the fence and within recs. Only this worker writes under
// its epoch, and each of its attempts stores an offset within recs: the
// records below the stored offset are committed, and write returns them.
func (w *worker) write(recs []*kgo.Record, retry bool) (int, exit) {
	cfg := &w.c.cfg
	start := time.Now()
	part := recs[:min(len(recs), w.size)]
	b, links, why := w.decode(part)
	if b == nil {
		return 0, why
	}
	b.AllowPrefix, b.Isolate = true, w.dense
	b.DeferOffset = !retry && w.mayDeferOffset()
	defer func() {
		// Nothing keeps a batch's events once it is written or given up
		// (Write does not, nor do the handlers' copies): the next batch
		// reuses the slice.
		clear(b.Events)
		w.events = b.Events[:0]
	}()
	ctx, span := w.c.tracer.Start(w.ctx, "onceflow.batch", trace.WithLinks(links...), trace.WithAttributes(
		attribute.String("messaging.destination.name", b.Topic),
		attribute.Int("messaging.destination.partition.id", int(b.Partition)),
		attribute.Int64("onceflow.first_offset", part[0].Offset),
		attribute.Int64("onceflow.next_offset", b.NextOffset),
		attribute.Int64("onceflow.epoch", b.Epoch),
		attribute.Int("messaging.batch.message_count", len(part)),
		attribute.Int("onceflow.events", len(b.Events)),
		attribute.Int("onceflow.dead_letters", len(b.DeadLetters)),
	))
	defer span.End()

	backoff := cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			// A retry stores its offset: the attempt before may have
			// committed with its outcome lost, and a batch found whole
			// because of it must reach the offset's compare-and-set to
			// learn so, not leave the fence behind the offset stored.
			b.DeferOffset = false
		}
		res, err := w.c.writer.Write(ctx, b)
		var fe *sink.FencedError
		if errors.As(err, &fe) && fe.StoredEpoch == b.Epoch && fe.StoredOffset > b.Fence &&
			fe.StoredOffset <= recs[len(recs)-1].Offset+1 {
			// An earlier attempt's COMMIT went through although its
			// outcome was lost: the records below the stored offset are
			// committed.
			n := upTo(recs, fe.StoredOffset)
			w.c.log.Info("batch found committed by an earlier attempt", "topic", b.Topic, "partition", b.Partition,
				"offset", recs[0].Offset, "batch_size", n, "next_offset", fe.StoredOffset)
			// Its outcome is unknown, counted as something written; how
			// many dead letters it inserted is not known: none is counted
			// (dead_letters holds them).
			w.committed(ctx, b, recs[:n], sink.Result{NextOffset: fe.StoredOffset}, start)
			w.wroteNothing = false
			return n, committed
		}
		if err == nil {
			n := len(part)
			// A NextOffset not above the batch's first record (a Writer
			// that does not set it) is the whole batch.
			if res.NextOffset > part[0].Offset && res.NextOffset < b.NextOffset {
				// A prefix committed, all the isolation had time for: the
				// rest follows in batches of about twice that, which the
				// next transactions isolate whole or nearly, without
				// halving all of the rest again first.
				n = upTo(part, res.NextOffset)
				w.size, w.whole = max(1, min(w.size, 2*n)), 0
				w.dense = 2*len(res.Rejected) >= n
			} else {
				res.NextOffset = b.NextOffset
				w.grow()
				w.dense = false
			}
			w.committed(ctx, b, part[:n], res, start)
			// Nothing applied at the first try: the next batch may try to
			// defer (the Writer checks; undecodable records, dead letters
			// in every pass, do not stop a re-read from deferring).
			w.wroteNothing = attempt == 1 && res.Applied == 0 && len(res.Rejected) == 0
			span.SetAttributes(attribute.Int("onceflow.applied", res.Applied),
				attribute.Int("onceflow.skipped_lru", res.SkippedLRU),
				attribute.Int("onceflow.skipped_postgres", res.SkippedPostgres),
				attribute.Int("onceflow.attempts", attempt),
				attribute.Int64("onceflow.committed_to", res.NextOffset),
				attribute.Bool("onceflow.offset_deferred", res.OffsetDeferred))
			return n, committed
		}
		span.RecordError(err)
		class := sink.Classify(err)
		shrink := class == sink.Transient && sink.IsTimeout(err) && len(part) > 1
		switch {
		case class == sink.Fenced:
			w.c.stats.fenced.Add(1)
			span.SetStatus(codes.Error, "fenced")
			w.c.log.Warn("batch fenced: another member took the partition; this worker stops and writes nothing more",
				"topic", b.Topic, "partition", b.Partition, "offset", part[0].Offset, "batch_size", len(part),
				"epoch", b.Epoch, "err", err)
			return 0, fenced
		case w.ctx.Err() != nil:
			span.SetStatus(codes.Error, "aborted")
			return 0, aborted
		case shrink:
			w.size, w.whole = max(1, len(part)/2), 0
			w.c.log.Warn("batch timed out; retrying its records in smaller batches", "topic", b.Topic, "partition", b.Partition,
				"offset", part[0].Offset, "batch_size", len(part), "next_batch_size", w.size, "attempt", attempt,
				"class", class.String(), "backoff", backoff, "err", err)
		case class == sink.Transient:
			w.c.log.Warn("batch failed; retrying", "topic", b.Topic, "partition", b.Partition, "offset", part[0].Offset,
				"batch_size", len(part), "attempt", attempt, "class", class.String(), "backoff", backoff, "err", err)
		default:
			w.c.log.Error("batch failed with an error that is neither transient nor caused by the data; retrying until it is fixed "+
				"(a handler that knows an event can never apply should return sink.RejectError)",
				"topic", b.Topic, "partition", b.Partition, "offset", part[0].Offset, "batch_size", len(part),
				"attempt", attempt, "class", class.String(), "backoff", backoff, "err", err)
		}
		w.c.stats.retries.Add(1)
		w.setRetrying(true)
		if !w.sleep(backoff) {
			span.SetStatus(codes.Error, "given up: the worker stops")
			if w.ctx.Err() != nil {
				return 0, aborted
			}
			return 0, stopped
		}
		if shrink {
			return 0, smaller
		}
		backoff = min(2*backoff, cfg.MaxRetryBackoff)
	}
}

// growAfter is how many batches in a row a worker commits whole at a
// reduced size before it doubles the size: a transaction that timed out
// at twice the size costs a TxTimeout, so a database that stays slow
// costs one such timeout every growAfter batches, while one that is fast
// again is back at full batches after a few dozen.
const growAfter = 4

// grow counts a batch committed whole and doubles the batch size after
// growAfter of them.
func (w *worker) grow() {
	if w.size >= w.c.cfg.BatchMaxRecords {
		return
	}
	if w.whole++; w.whole >= growAfter {
		w.size, w.whole = min(2*w.size, w.c.cfg.BatchMaxRecords), 0
	}
}

// upTo returns how many of recs, in offset order, lie below next.
func upTo(recs []*kgo.Record, next int64) int {
	n, _ := slices.BinarySearchFunc(recs, next, func(r *kgo.Record, next int64) int { return cmp.Compare(r.Offset, next) })
	return n
}

// decode makes recs a batch (see batch), trying again with capped backoff
// while the schema registry fails for now: the partition waits (paused
// once its queue fills, the others go on) and no record becomes a dead
// letter because a registry was down. A registry refusing the credentials
// ends the run (Consumer.fail) and the batch is given up (aborted), as it
// is when the worker is told to stop while waiting (stopped): either way
// the batch returned is nil and nothing of recs is written.
func (w *worker) decode(recs []*kgo.Record) (*sink.Batch, []trace.Link, exit) {
	cfg := &w.c.cfg
	defer w.setRetrying(false)
	backoff := cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		b, links, err := w.batch(recs)
		if err == nil {
			return b, links, committed
		}
		if w.ctx.Err() != nil {
			return nil, nil, aborted
		}
		if registry.IsAuth(err) {
			w.c.fail(err)
			return nil, nil, aborted
		}
		w.c.log.Warn("schema registry failed; decoding the batch again after the backoff (nothing is dead-lettered for it)",
			"topic", w.key.topic, "partition", w.key.partition, "offset", recs[0].Offset, "batch_size", len(recs),
			"attempt", attempt, "backoff", backoff, "err", err)
		w.c.stats.retries.Add(1)
		w.setRetrying(true)
		if !w.sleep(backoff) {
			if w.ctx.Err() != nil {
				return nil, nil, aborted
			}
			return nil, nil, stopped
		}
		backoff = min(2*backoff, cfg.MaxRetryBackoff)
	}
}

// batch decodes recs; records that cannot be decoded become the batch's
// dead letters. An error is the schema registry's (or the worker's
// context's): the batch is not made.
func (w *worker) batch(recs []*kgo.Record) (*sink.Batch, []trace.Link, error) {
	cfg := &w.c.cfg
	b := &sink.Batch{Topic: w.key.topic, Partition: w.key.partition, Epoch: w.epoch, Fence: w.fence,
		NextOffset: recs[len(recs)-1].Offset + 1, TopicID: w.topicID, Events: w.events[:0]}
	var links []trace.Link
	for _, r := range recs {
		ev, err := DecodeContext(w.ctx, r, cfg.Decode)
		var de *DecodeError
		if err != nil && !errors.As(err, &de) {
			return nil, nil, fmt.Errorf("decode %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
		}
		if de != nil {
			b.DeadLetters = append(b.DeadLetters, sink.DeadLetter{
				Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				EventID: de.EventID, Reason: de.Reason, Key: r.Key, Value: r.Value,
			})
			// Logged by the Writer once recorded: not on a re-read that
			// finds it recorded already.
			w.c.log.Debug("the record cannot be decoded: a dead letter unless recorded already", "topic", r.Topic,
				"partition", r.Partition, "offset", r.Offset, "reason", de.Reason)
			continue
		}
		if w.c.traced {
			ev.Producer = trace.SpanContextFromContext(cfg.Propagator.Extract(context.Background(), wire.RecordCarrier{Record: r}))
			if ev.Producer.IsValid() && len(links) < maxLinks {
				links = append(links, trace.Link{SpanContext: ev.Producer})
			}
		}
		b.Events = append(b.Events, ev)
	}
	return b, links, nil
}

// offsetEvery is how long, at most, a partition's stored offset lags
// behind the batches it re-reads found whole (see mayDeferOffset).
const offsetEvery = time.Second

// mayDeferOffset reports whether the next batch may leave its offset
// unstored if it writes nothing else (sink.Batch.DeferOffset): the last
// batch found every event applied (a replay's re-read, most likely, where
// deferring saves a transaction per batch and guessing wrong costs a
// look-up), more records are queued (so the batch of a run's last records
// stores: a partition gone idle has its offset stored), and an offset was
// stored less than offsetEvery ago (a new owner that takes the partition
// from a crashed member reads about that much again; a worker told to
// stop stores it: storeDeferred). A retry never defers.
func (w *worker) mayDeferOffset() bool {
	if !w.wroteNothing || time.Since(w.storedAt) >= offsetEvery {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue) > 0
}

// committed records a committed batch, which covered recs and stored
// res.NextOffset: the new fence and the Kafka mark (unless the batch
// deferred its offset), the counters and the OnBatch callback.
func (w *worker) committed(ctx context.Context, b *sink.Batch, recs []*kgo.Record, res sink.Result, start time.Time) {
	if res.OffsetDeferred {
		w.deferred = recs[len(recs)-1]
	} else {
		w.fence, w.storedAt, w.deferred = res.NextOffset, time.Now(), nil
	}
	w.next.Store(res.NextOffset)
	w.inflight.Store(nil)
	if !w.c.aborting.Load() && !res.OffsetDeferred {
		// Only now may Kafka learn of the batch: marked offsets are
		// committed in the background, on revoke and on shutdown. Kafka
		// does not hear of a batch that deferred its offset either, so
		// the group's committed offset never passes the stored one.
		_, mark := w.c.tracer.Start(ctx, "kafka.mark_offset",
			trace.WithAttributes(attribute.Int64("messaging.kafka.offset", res.NextOffset)))
		w.c.cl.MarkCommitRecords(recs[len(recs)-1])
		mark.End()
	}
	s := &w.c.stats
	s.batches.Add(1)
	if res.OffsetDeferred {
		s.deferred.Add(1)
	}
	s.applied.Add(int64(res.Applied))
	s.skippedLRU.Add(int64(res.SkippedLRU))
	s.skippedPG.Add(int64(res.SkippedPostgres))
	s.dead.Add(int64(res.DeadLetters))
	s.conflicts.Add(int64(res.Conflicts))
	if res.DeadLetters > 0 {
		select {
		case w.c.dlWake <- struct{}{}:
		default:
		}
	}
	if cb := w.c.cfg.OnBatch; cb != nil {
		cb(BatchInfo{Topic: b.Topic, Partition: b.Partition, Records: len(recs),
			NextOffset: res.NextOffset, Result: res, Duration: time.Since(start)})
	}
}

func (w *worker) setRetrying(on bool) {
	if w.retrying == on {
		return
	}
	w.retrying = on
	w.retryingNow.Store(on)
	if on {
		w.c.stats.retrying.Add(1)
	} else {
		w.c.stats.retrying.Add(-1)
	}
}

// sleep waits d, or returns false early when the worker is told to stop or
// aborted: a batch waiting to be retried is then given up, never written.
func (w *worker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.ctx.Done():
	case <-w.quit:
	}
	return false
}

// fenced is called by a worker that stopped because another writer took
// its partition. The partition stays paused, with no worker, and is taken
// again after the session timeout if this member still owns it then: a
// zombie that took it late learns from the group by then that it lost it.
func (c *Consumer) fenced(w *worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	part := c.parts[w.key]
	if part == nil || part.w != w {
		return
	}
	part.w = nil
	part.retakeAt = time.Now().Add(c.cfg.SessionTimeout)
	c.cl.PauseFetchPartitions(map[string][]int32{w.key.topic: {w.key.partition}})
}
