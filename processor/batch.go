// Making a batch: the records decoded into sink.Batch events, dead letters
// for those that cannot be, the producers' trace links, and waiting while
// the schema registry fails for now.

package processor

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// maxLinks bounds the producer links of one batch span.
const maxLinks = 128

// decode makes recs a batch (see batch), trying again with capped backoff
// while the schema registry fails for now: the partition waits (paused
// once its queue fills, the others go on) and no record becomes a dead
// letter because a registry was down. A registry refusing the credentials
// ends the run (Consumer.fail) and the batch is given up (aborted), as it
// is when the worker is told to stop while waiting (stopped): either way
// the batch returned is nil and nothing of recs is written.
func (w *worker) decode(recs []*kgo.Record) (*sink.Batch, []trace.Link, exit) {
	cfg := &w.c.cfg
	// Records being written again after a failure (write's retries, the
	// smaller batches after a timeout) stay retrying once decoded.
	was := w.retrying
	defer func() { w.setRetrying(was) }()
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
// dead letters. A transaction's commit or abort marker (a control record)
// is neither: the batch's offset moves over it, as Kafka's consumer's
// position does, and a batch of markers alone stores just the offset. An
// error is the schema registry's (or the worker's context's): the batch is
// not made.
func (w *worker) batch(recs []*kgo.Record) (*sink.Batch, []trace.Link, error) {
	cfg := &w.c.cfg
	b := &sink.Batch{Topic: w.key.topic, Partition: w.key.partition, Epoch: w.epoch, Fence: w.fence,
		NextOffset: recs[len(recs)-1].Offset + 1, TopicID: w.topicID, Events: w.events[:0]}
	var links []trace.Link
	// The events' headers, in one allocation for the batch: new for each
	// batch, since a handler may keep what an event points to.
	nh := 0
	for _, r := range recs {
		nh += len(r.Headers)
	}
	slab := make([]sink.Header, 0, nh)
	dc := cfg.Decode.withDefaults()
	for _, r := range recs {
		if r.Attrs.IsControl() {
			continue
		}
		ev, err := decodeRecord(w.ctx, r, dc, &slab)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				return nil, nil, fmt.Errorf("decode %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
			}
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
