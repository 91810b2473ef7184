// Deferring a partition's offset: a batch that re-reads records found
// applied may leave its offset unstored for up to offsetEvery
// (mayDeferOffset), and a worker told to stop stores it (storeDeferred).

package processor

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/sink"
)

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
