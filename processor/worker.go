package processor

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

const (
	noRow        = -1 // sink_offsets has no row for the partition
	unknownFence = -2 // the stored offset could not be read: read it before writing
)

// maxLinks bounds the producer links of one batch span.
const maxLinks = 128

// worker owns one assigned partition: it batches that partition's records
// and writes each batch in one transaction. It is started on assignment and
// stopped by closing quit (after abort, on loss); done closes when it has
// exited.
type worker struct {
	c   *Consumer
	cl  *kgo.Client
	key tp

	recs chan []*kgo.Record // from the poll loop; unbuffered: the poll loop waits, keeping the backlog in Kafka
	quit chan struct{}
	done chan struct{}

	ctx   context.Context // canceled on abort
	abort context.CancelFunc

	fence atomic.Int64 // the sink_offsets value this worker last read or wrote
	next  atomic.Int64 // records below it are already written: dropped
	hw    atomic.Int64 // the partition's high watermark at the last fetch; -1 before
}

func newWorker(c *Consumer, cl *kgo.Client, key tp, fence int64) *worker {
	ctx, cancel := context.WithCancel(c.base)
	w := &worker{
		c: c, cl: cl, key: key,
		recs: make(chan []*kgo.Record), quit: make(chan struct{}), done: make(chan struct{}),
		ctx: ctx, abort: cancel,
	}
	w.fence.Store(fence)
	w.hw.Store(-1)
	if fence >= 0 {
		w.next.Store(fence)
	}
	return w
}

func (w *worker) run() {
	defer close(w.done)
	defer w.abort()
	cfg := &w.c.cfg
	var buf []*kgo.Record
	size := 0
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	flush := func(ctx context.Context) {
		if len(buf) > 0 {
			w.flush(ctx, buf)
		}
		buf, size = nil, 0
		linger.Stop()
	}
	for {
		select {
		case <-w.quit:
			// Revoked or shutting down: finish the batch in hand, within
			// the drain timeout. (On loss ctx is already canceled.)
			ctx, cancel := context.WithTimeout(w.ctx, cfg.DrainTimeout)
			flush(ctx)
			cancel()
			return
		case recs := <-w.recs:
			for _, r := range recs {
				if r.Offset < w.next.Load() {
					continue
				}
				if len(buf) == 0 {
					linger.Reset(cfg.BatchLinger)
				}
				buf = append(buf, r)
				size += len(r.Value)
				if len(buf) >= cfg.BatchMaxRecords || size >= cfg.BatchMaxBytes {
					flush(w.ctx)
				}
			}
		case <-linger.C:
			flush(w.ctx)
		}
	}
}

// flush decodes recs into a batch and writes it, retrying until it commits,
// the worker is stopped, or ctx ends. Only after COMMIT is the last record
// marked for the Kafka commit.
func (w *worker) flush(ctx context.Context, recs []*kgo.Record) {
	cfg := &w.c.cfg
	start := time.Now()
	last := recs[len(recs)-1]
	b := &sink.Batch{Topic: w.key.topic, Partition: w.key.partition, NextOffset: last.Offset + 1}
	var links []trace.Link
	for _, r := range recs {
		ev, err := Decode(r, cfg.Decode)
		var de *DecodeError
		if errors.As(err, &de) {
			b.DeadLetters = append(b.DeadLetters, sink.DeadLetter{
				Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				EventID: de.EventID, Reason: de.Reason, Key: r.Key, Value: r.Value,
			})
			w.c.log.Warn("dead letter", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "reason", de.Reason)
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

	ctx, span := w.c.tracer.Start(ctx, "onceflow.batch", trace.WithLinks(links...), trace.WithAttributes(
		attribute.String("messaging.destination.name", b.Topic),
		attribute.Int("messaging.destination.partition.id", int(b.Partition)),
		attribute.Int64("onceflow.first_offset", recs[0].Offset),
		attribute.Int64("onceflow.next_offset", b.NextOffset),
		attribute.Int("messaging.batch.message_count", len(recs)),
		attribute.Int("onceflow.events", len(b.Events)),
		attribute.Int("onceflow.dead_letters", len(b.DeadLetters)),
	))
	defer span.End()

	backoff := cfg.RetryBackoff
	producedDLQ := false
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			w.c.stats.retries.Add(1)
			if !w.sleep(ctx, backoff) {
				span.SetStatus(codes.Error, "aborted")
				return
			}
			backoff = min(2*backoff, cfg.MaxRetryBackoff)
		}
		if w.fence.Load() == unknownFence && !w.resync(ctx, b) {
			continue
		}
		if !producedDLQ && len(b.DeadLetters) > 0 {
			if err := w.produceDeadLetters(ctx, b.DeadLetters); err != nil {
				w.c.log.Warn("produce dead letters", "topic", cfg.DeadLetterTopic, "err", err, "attempt", attempt)
				continue
			}
			producedDLQ = true
		}
		b.Fence = w.fence.Load()
		res, err := w.c.writer.Write(ctx, b)
		switch {
		case err == nil:
			w.fence.Store(b.NextOffset)
			w.next.Store(b.NextOffset)
			// Events a handler rejected became dead letters inside the
			// transaction; publish them before the Kafka offset moves.
			w.publishRejected(ctx, res.Rejected)
			if !w.c.aborting.Load() {
				// Only now may Kafka learn of the batch: marked offsets are
				// committed in the background, on revoke and on shutdown.
				_, mark := w.c.tracer.Start(ctx, "kafka.mark_offset",
					trace.WithAttributes(attribute.Int64("messaging.kafka.offset", b.NextOffset)))
				w.cl.MarkCommitRecords(last)
				mark.End()
			}
			w.count(res)
			span.SetAttributes(attribute.Int("onceflow.applied", res.Applied),
				attribute.Int("onceflow.skipped_lru", res.SkippedLRU),
				attribute.Int("onceflow.skipped_postgres", res.SkippedPostgres))
			if cfg.OnBatch != nil {
				cfg.OnBatch(BatchInfo{Topic: b.Topic, Partition: b.Partition, Records: len(recs),
					NextOffset: b.NextOffset, Result: res, Duration: time.Since(start)})
			}
			return
		case ctx.Err() != nil:
			span.SetStatus(codes.Error, "aborted")
			return
		case errors.Is(err, sink.ErrFenced):
			w.c.stats.fenced.Add(1)
			span.AddEvent("fenced")
			w.c.log.Warn("batch fenced: another writer moved the stored offset; rolled back",
				"topic", b.Topic, "partition", b.Partition, "offset", recs[0].Offset, "fence", b.Fence)
			if !w.resync(ctx, b) {
				continue
			}
			if len(b.Events)+len(b.DeadLetters) == 0 {
				return // everything in the batch was already written by the other writer
			}
			backoff = cfg.RetryBackoff
		default:
			w.c.log.Warn("batch failed; retrying", "topic", b.Topic, "partition", b.Partition,
				"offset", recs[0].Offset, "batch_size", len(recs), "attempt", attempt,
				"retryable", sink.IsRetryable(err), "err", err)
			span.RecordError(err)
		}
	}
}

// resync reads the partition's stored offset, adopts it as the fence, drops
// from b what lies below it, and seeks the client there if it is ahead.
// It reports false if the offset could not be read.
func (w *worker) resync(ctx context.Context, b *sink.Batch) bool {
	stored, err := w.c.writer.StoredOffsets(ctx, w.key.topic, []int32{w.key.partition})
	if err != nil {
		w.c.log.Warn("read stored offset", "topic", w.key.topic, "partition", w.key.partition, "err", err)
		return false
	}
	s, ok := stored[w.key.partition]
	if !ok {
		w.fence.Store(noRow)
		return true
	}
	w.fence.Store(s)
	if s <= w.next.Load() {
		return true
	}
	w.next.Store(s)
	b.Events = dropBelow(b.Events, s, func(e sink.Event) int64 { return e.Offset })
	b.DeadLetters = dropBelow(b.DeadLetters, s, func(d sink.DeadLetter) int64 { return d.Offset })
	if s > b.NextOffset {
		b.NextOffset = s
	}
	w.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{w.key.topic: {w.key.partition: {Epoch: -1, Offset: s}}})
	return true
}

func dropBelow[T any](xs []T, min int64, offset func(T) int64) []T {
	out := xs[:0]
	for _, x := range xs {
		if offset(x) >= min {
			out = append(out, x)
		}
	}
	return out
}

// publishRejected publishes dead letters found inside a committed
// transaction, retrying until it succeeds or the worker stops. They are
// already in the dead_letters table, so a crash here loses nothing.
func (w *worker) publishRejected(ctx context.Context, dls []sink.DeadLetter) {
	backoff := w.c.cfg.RetryBackoff
	for len(dls) > 0 {
		err := w.produceDeadLetters(ctx, dls)
		if err == nil {
			return
		}
		w.c.log.Warn("produce dead letters", "topic", w.c.cfg.DeadLetterTopic, "err", err)
		if !w.sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, w.c.cfg.MaxRetryBackoff)
	}
}

func (w *worker) produceDeadLetters(ctx context.Context, dls []sink.DeadLetter) error {
	topic := w.c.cfg.DeadLetterTopic
	if topic == "" {
		return nil
	}
	recs := make([]*kgo.Record, len(dls))
	for i, d := range dls {
		recs[i] = &kgo.Record{Topic: topic, Key: d.Key, Value: d.Value, Headers: []kgo.RecordHeader{
			{Key: "reason", Value: []byte(d.Reason)},
			{Key: "topic", Value: []byte(d.Topic)},
			{Key: "partition", Value: []byte(strconv.Itoa(int(d.Partition)))},
			{Key: "offset", Value: []byte(strconv.FormatInt(d.Offset, 10))},
		}}
		if d.EventID.Valid {
			recs[i].Headers = append(recs[i].Headers, kgo.RecordHeader{Key: HeaderEventID, Value: []byte(d.EventID.UUID.String())})
		}
	}
	return w.cl.ProduceSync(ctx, recs...).FirstErr()
}

func (w *worker) count(res sink.Result) {
	s := &w.c.stats
	s.batches.Add(1)
	s.applied.Add(int64(res.Applied))
	s.skippedLRU.Add(int64(res.SkippedLRU))
	s.skippedPG.Add(int64(res.SkippedPostgres))
	s.dead.Add(int64(res.DeadLetters))
}

// sleep waits d, or returns false early when the worker is told to stop or
// ctx ends: a batch that cannot commit is then aborted, never half-applied.
func (w *worker) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-w.quit:
	}
	return false
}
