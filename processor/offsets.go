package processor

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
)

// logBounds is a partition's log: [start, end) where end is the high
// watermark. known is false when the brokers could not be asked.
type logBounds struct {
	start, end int64
	known      bool
}

// logBounds returns the log bounds of the partitions of topic: stored
// offsets are checked against them, and the high watermark is the lag's
// until a fetch brings records (an empty or caught-up partition's lag is
// then 0, not unknown). Brokers that do not answer within a few attempts
// leave the bounds unknown (and the check undone), with a warning when an
// offset was stored.
func (c *Consumer) logBounds(ctx context.Context, topic string, leases map[int32]sink.Lease) map[int32]logBounds {
	out := map[int32]logBounds{}
	stored := false
	for _, l := range leases {
		stored = stored || l.NextOffset >= 0
	}
	adm := kadm.NewClient(c.cl)
	var err error
	for attempt := range 3 {
		var starts, ends kadm.ListedOffsets
		lctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		starts, err = adm.ListStartOffsets(lctx, topic)
		if err == nil {
			ends, err = adm.ListEndOffsets(lctx, topic)
		}
		cancel()
		if err == nil {
			err = starts.Error()
		}
		if err == nil {
			err = ends.Error()
		}
		if err == nil {
			for p := range leases {
				s, okS := starts.Lookup(topic, p)
				e, okE := ends.Lookup(topic, p)
				if okS && okE {
					out[p] = logBounds{start: s.Offset, end: e.Offset, known: true}
				}
			}
			return out
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	if stored {
		c.log.Warn("list the partitions' log bounds; stored offsets are not checked against them", "topic", topic, "err", err)
	}
	return out
}

// restartOffset is where a partition taken again after a fence starts: the
// offset stored in Postgres, else the group's committed offset in Kafka,
// else the log start. An offset stored under another topic id than the
// one the partition was assigned with (the topic deleted and recreated
// since) is not an offset of the log there is: the partition starts from
// its log start.
func (c *Consumer) restartOffset(ctx context.Context, cl *kgo.Client, k tp, l sink.Lease) (int64, error) {
	c.mu.Lock()
	id := c.topicIDs[k.topic]
	c.mu.Unlock()
	recreated := id.Valid && l.TopicID.Valid && id.UUID != l.TopicID.UUID
	switch {
	case l.NextOffset >= 0 && !recreated:
		return l.NextOffset, nil
	case recreated:
		c.stats.outOfRange.Add(1)
		c.log.Error("stored offset is of a topic deleted since and recreated under the same name (its topic id changed from "+
			l.TopicID.UUID.String()+" to "+id.UUID.String()+"); consuming from the log start",
			"topic", k.topic, "partition", k.partition, "stored_offset", l.NextOffset)
		return c.logStart(ctx, cl, k)
	}
	adm := kadm.NewClient(cl)
	committed, err := adm.FetchOffsetsForTopics(ctx, c.cfg.Group, k.topic)
	if err != nil {
		return 0, fmt.Errorf("fetch committed offsets: %w", err)
	}
	if o, ok := committed.Lookup(k.topic, k.partition); ok && o.Err == nil && o.At >= 0 {
		return o.At, nil
	}
	return c.logStart(ctx, cl, k)
}

// logStart is partition k's log start offset.
func (c *Consumer) logStart(ctx context.Context, cl *kgo.Client, k tp) (int64, error) {
	starts, err := kadm.NewClient(cl).ListStartOffsets(ctx, k.topic)
	if err != nil {
		return 0, fmt.Errorf("list start offsets: %w", err)
	}
	s, ok := starts.Lookup(k.topic, k.partition)
	if !ok || s.Err != nil {
		return 0, fmt.Errorf("no start offset for %s/%d", k.topic, k.partition)
	}
	return s.Offset, nil
}
