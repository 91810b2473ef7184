package processor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// Dead-letter topic headers.
const (
	HeaderReason       = "reason"
	HeaderTopic        = "topic"
	HeaderPartition    = "partition"
	HeaderOffset       = "offset"
	HeaderValueOmitted = "value_omitted"
	// HeaderTopicID is the Kafka topic id of the record's topic, when
	// known: it tells apart the dead letters of a topic deleted and
	// recreated under the same name, whose offsets start again from 0.
	HeaderTopicID = "topic_id"
)

const (
	deadLetterBatch = 100             // dead letters published per round
	deadLetterIdle  = 2 * time.Second // wait when none is pending
)

// publishDeadLetters copies dead letters from the dead_letters table (the
// truth, written in each batch's transaction) to the dead-letter topic,
// until ctx ends. It is asynchronous and at least once: a row is marked
// published only after the broker acknowledged its copy. A copy the
// broker refused is released (its lease ended) and tried again after the
// backoff the log line gives; a copy whose produce was still under way
// when ProduceTimeout ran out keeps its lease, so no publisher copies it
// again while it may still arrive, and is published again when the lease
// runs out (2×ProduceTimeout + CallTimeout after it was leased). A broker
// that is down or refuses a copy delays only the copies; no partition
// waits for them.
func (c *Consumer) publishDeadLetters(ctx context.Context, cl *kgo.Client) {
	backoff := c.cfg.RetryBackoff
	for {
		n, err := c.publishDeadLettersOnce(ctx, cl)
		if ctx.Err() != nil {
			return
		}
		wait := deadLetterIdle
		switch {
		case err != nil:
			// Said once per repeatWindow while the same copies fail the
			// same way: a refusal that lasts would be said at every
			// MaxRetryBackoff.
			if ok, held := c.repeats.allow(fmt.Sprint("deadletters", err), time.Now()); ok {
				c.log.Warn("publish dead letters; retrying", "dead_letter_topic", c.cfg.DeadLetterTopic, "err", err,
					"backoff", backoff, "repeated", held)
			}
			wait = backoff
			backoff = min(2*backoff, c.cfg.MaxRetryBackoff)
		case n == deadLetterBatch:
			wait = 0
			backoff = c.cfg.RetryBackoff
		default:
			backoff = c.cfg.RetryBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-c.dlWake:
		case <-time.After(wait):
		}
	}
}

// publishDeadLettersOnce publishes one round of pending dead letters and
// returns how many it leased.
func (c *Consumer) publishDeadLettersOnce(ctx context.Context, cl *kgo.Client) (int, error) {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	lease := 2*c.cfg.ProduceTimeout + c.cfg.CallTimeout
	pending, err := c.writer.LeaseDeadLetters(lctx, deadLetterBatch, lease)
	cancel()
	if err != nil || len(pending) == 0 {
		return 0, err
	}
	recs := make([]*kgo.Record, len(pending))
	for i, d := range pending {
		recs[i] = c.deadLetterRecord(d, true)
	}
	results := wire.Produce(ctx, cl, recs, c.cfg.ProduceTimeout)
	var ids, refused []int64
	var notes []string
	var failed error
	recreated := false
	for i, perr := range results {
		d := pending[i]
		switch {
		case errors.Is(perr, wire.ErrStillProducing):
			failed = errors.Join(failed, fmt.Errorf("dead letter of %s/%d@%d: %w; published again when its lease ends, %v after it was leased",
				d.Topic, d.Partition, d.Offset, perr, lease))
		case errors.Is(perr, kerr.UnknownTopicID):
			recreated = true
			refused = append(refused, d.ID)
			failed = errors.Join(failed, fmt.Errorf("dead letter of %s/%d@%d: %w", d.Topic, d.Partition, d.Offset, perr))
		case perr == nil:
			ids, notes = append(ids, d.ID), append(notes, "")
		case tooLarge(perr):
			note := fmt.Sprintf("published without its value: %d bytes are too large for the dead-letter topic "+
				"(the topic's max.message.bytes, or the producer's maximum record batch, franz-go's ProducerBatchMaxBytes, 1000012 bytes by default): %v",
				len(d.Value), perr)
			rec := c.deadLetterRecord(d, false)
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderValueOmitted, Value: []byte(note)})
			if err := wire.Produce(ctx, cl, []*kgo.Record{rec}, c.cfg.ProduceTimeout)[0]; err != nil {
				if !errors.Is(err, wire.ErrStillProducing) {
					refused = append(refused, d.ID)
				}
				failed = errors.Join(failed, fmt.Errorf("dead letter of %s/%d@%d without its value: %w", d.Topic, d.Partition, d.Offset, err))
				continue
			}
			c.log.Warn("dead letter published without its value", "topic", d.Topic, "partition", d.Partition,
				"offset", d.Offset, "dead_letter_topic", c.cfg.DeadLetterTopic, "value_bytes", len(d.Value), "err", perr)
			ids, notes = append(ids, d.ID), append(notes, note)
		default:
			refused = append(refused, d.ID)
			failed = errors.Join(failed, fmt.Errorf("dead letter of %s/%d@%d: %w", d.Topic, d.Partition, d.Offset, perr))
		}
	}
	if recreated {
		// franz-go keeps a topic's first id for the client's life and
		// fails every produce to a topic recreated under the same name
		// until the topic is purged from producing; then it learns the
		// new one. The copies refused are published again when their
		// lease ends.
		c.log.Warn("dead-letter topic deleted, perhaps recreated under the same name (its topic id is unknown to the brokers): "+
			"the client forgets it and learns it again", "dead_letter_topic", c.cfg.DeadLetterTopic)
		cl.PurgeTopicsFromProducing(c.cfg.DeadLetterTopic)
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CallTimeout)
	defer cancel()
	if err := c.writer.MarkDeadLettersPublished(mctx, ids, notes); err != nil {
		failed = errors.Join(failed, err)
	} else {
		c.stats.published.Add(int64(len(ids)))
	}
	// The refused copies are tried again after the backoff, not when
	// their lease ends; if they cannot be released, then.
	if err := c.writer.ReleaseDeadLetters(mctx, refused); err != nil {
		failed = errors.Join(failed, fmt.Errorf("%w; the refused copies are published again when their lease ends, %v after it was leased", err, lease))
	}
	return len(pending), failed
}

// deadLetterRecord is the dead-letter topic's copy of d.
func (c *Consumer) deadLetterRecord(d sink.PendingDeadLetter, withValue bool) *kgo.Record {
	r := &kgo.Record{Topic: c.cfg.DeadLetterTopic, Key: d.Key, Headers: []kgo.RecordHeader{
		{Key: HeaderReason, Value: []byte(d.Reason)},
		{Key: HeaderTopic, Value: []byte(d.Topic)},
		{Key: HeaderPartition, Value: []byte(strconv.Itoa(int(d.Partition)))},
		{Key: HeaderOffset, Value: []byte(strconv.FormatInt(d.Offset, 10))},
	}}
	if withValue {
		r.Value = d.Value
	}
	if d.EventID.Valid {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderEventID, Value: []byte(d.EventID.UUID.String())})
	}
	if d.TopicID.Valid {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderTopicID, Value: []byte(d.TopicID.UUID.String())})
	}
	return r
}

// tooLarge reports whether a produce failed because the record is too
// large for the producer or the topic.
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord)
}
