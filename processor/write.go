// Writing a batch: flush writes the records taken, write retries transient
// failures with capped backoff and halves the batch after a timeout (grow
// doubles it back), and committed marks the Kafka offset after COMMIT.

package processor

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/sink"
)

// flush writes recs, in order, until all are committed or the worker must
// give up: the worker is told to stop while waiting to retry, or between
// two of the batches below (stopped), the partition was taken by another
// writer (fenced), or the transaction's context was canceled (aborted).
// It writes them as one batch when it can, and as several when the
// Writer commits a prefix of a batch whose isolation of culprits runs
// long (sink.Batch.AllowPrefix) or is cut short because the worker is
// told to stop (sink.Batch.Stop), or when a transaction times out (see
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
			w.setRetrying(false)
			if len(recs) > 0 {
				w.inflight.Store(recs[0]) // a prefix committed: the rest is in flight
			}
			if len(recs) > 0 && w.stopping() {
				// As nextBatch: a stopping worker starts no batch; the
				// records left are the next owner's to read.
				return stopped
			}
		case smaller:
			retry = true // and retrying, until a batch of them commits
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
	// A worker told to stop while its batch isolates culprits goes on
	// isolating for half of DrainTimeout, then commits what the isolation
	// settled (at least one event) at the next savepoint group, rather
	// than holding a revoke up until DrainTimeout aborts it all: the next
	// owner starts after it. Without this, an isolation longer than the
	// time between two rebalances would start again from the same record
	// with each owner, for ever; stopping at once, each owner would settle
	// little more than one event when rebalances come every few seconds.
	// A lone record is tried in the plain transaction whatever came
	// before: the cheapest in round trips, and its isolation, if it fails
	// on its data, is one savepoint group.
	b.AllowPrefix, b.Isolate, b.Stop = true, w.dense && len(part) > 1, w.settle
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
		// The records that cannot be decoded; once the batch commits,
		// the dead letters it inserted (the events the handlers
		// refused too, not those recorded by an earlier read).
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
				attribute.Int("onceflow.dead_letters", res.DeadLetters),
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
		var ite *sink.IsolationTimeoutError
		if errors.As(err, &ite) {
			// Its round trips are long against the transaction's time:
			// the retry isolates from the start, event by event once a
			// group fails, and commits the prefix it settles in time.
			w.dense = true
		}
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

// committed records a committed batch, which covered recs and stored
// res.NextOffset: the new fence and the Kafka mark (unless the batch
// deferred its offset), the counters and the OnBatch callback.
func (w *worker) committed(ctx context.Context, b *sink.Batch, recs []*kgo.Record, res sink.Result, start time.Time) {
	if res.OffsetDeferred {
		w.deferred = recs[len(recs)-1]
	} else {
		w.fence, w.storedAt, w.deferred = res.NextOffset, time.Now(), nil
		w.stored.Store(true)
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
