// Offsets: where a partition starts (the log's bounds, the offset stored in
// Postgres) and the Kafka commits of the marked offsets, with their
// refusals.

package processor

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/sink"
)

// logBounds is a partition's log: [start, end) where end is the high
// watermark, and stable its last stable offset (end but for the records
// of open transactions). known is false when the brokers could not be
// asked.
type logBounds struct {
	start, end, stable int64
	known              bool
}

// logBounds returns the log bounds of the partitions of topic: stored
// offsets are checked against them, and the last stable offset is the
// lag's until a fetch brings records (an empty or caught-up partition's
// lag is then 0, not unknown). Brokers that do not answer within a few attempts
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
		var starts, ends, stables kadm.ListedOffsets
		lctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		starts, err = adm.ListStartOffsets(lctx, topic)
		if err == nil {
			ends, err = adm.ListEndOffsets(lctx, topic)
		}
		if err == nil {
			stables, err = adm.ListCommittedOffsets(lctx, topic)
		}
		cancel()
		if err == nil {
			err = errors.Join(starts.Error(), ends.Error(), stables.Error())
		}
		if err == nil {
			for p := range leases {
				s, okS := starts.Lookup(topic, p)
				e, okE := ends.Lookup(topic, p)
				st, okSt := stables.Lookup(topic, p)
				if okS && okE {
					b := logBounds{start: s.Offset, end: e.Offset, stable: e.Offset, known: true}
					if okSt && st.Offset >= 0 {
						b.stable = min(st.Offset, e.Offset)
					}
					out[p] = b
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

// Kafka offset commits.
//
// Postgres holds each partition's true offset, fenced by epoch, and a
// partition's next owner starts there; the group's committed offset in
// Kafka is a hint for tools (lag) and for a partition Postgres has no row
// for. A commit Kafka refuses therefore loses nothing and doubles nothing:
// the offset is committed again by the next commit of the partition's
// owner. Refusals are logged, never retried by onceflow, never a reason
// to stop a worker.
//
// Under the consumer protocol (KIP-848) a commit carries the member's
// epoch, and brokers before Kafka 4.3 refuse with STALE_MEMBER_EPOCH a
// commit sent as the epoch moves on (franz-go retries it with the new
// epoch, dropping the partitions no longer owned, but not forever), or
// with FENCED_MEMBER_EPOCH one from a member fenced since. Such a
// refusal is said once per partition and member epoch, at info.

// kgoCommitRefused is franz-go's line for each partition of a commit
// Kafka refused, with the offsets: a line per partition and commit, which
// the repeats cannot hold back (the offsets change with every commit).
// The Consumer's commit callback (commitDone) sees every commit and says
// the same, so the line is dropped.
const kgoCommitRefused = "unable to commit offset for topic partition"

// commitNotes remembers, per partition, the last member epoch whose
// commit refusal was logged. It is safe for concurrent use; it holds at
// most one entry per partition ever assigned.
type commitNotes struct {
	mu   sync.Mutex
	last map[tp]int32
}

// first reports whether k's refusal at epoch is the first said.
func (n *commitNotes) first(k tp, epoch int32) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.last == nil {
		n.last = map[tp]int32{}
	}
	if e, ok := n.last[k]; ok && e == epoch {
		return false
	}
	n.last[k] = epoch
	return true
}

// epochRefused reports whether err is a commit refused for the member's
// epoch (KIP-848), which costs nothing (see above).
func epochRefused(err error) bool {
	return errors.Is(err, kerr.StaleMemberEpoch) || errors.Is(err, kerr.FencedMemberEpoch)
}

// commitDone is called with the outcome of every Kafka commit, background
// or synchronous (revoke, shutdown), and logs what failed: an epoch
// refusal once per partition and epoch, other errors with repeats held
// back. It returns the first error of the commit, nil when every
// partition was committed or refused only for its epoch.
func (c *Consumer) commitDone(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) error {
	if err != nil {
		if errors.Is(err, context.Canceled) || c.aborting.Load() {
			return err
		}
		if ok, held := c.repeats.allow(fmt.Sprint("commit", err), time.Now()); ok {
			c.log.Warn("commit offsets to kafka; the offsets stored in postgres are not affected", "group", c.cfg.Group, "err", err, "repeated", held)
		}
		return err
	}
	var first error
	for _, t := range resp.Topics {
		topic := t.Topic
		for _, rt := range req.Topics {
			if topic == "" && rt.TopicID == t.TopicID { // v10+ answers with topic ids only
				topic = rt.Topic
			}
		}
		for _, p := range t.Partitions {
			perr := kerr.ErrorForCode(p.ErrorCode)
			switch {
			case perr == nil:
			case epochRefused(perr):
				if c.commits.first(tp{topic, p.Partition}, req.Generation) {
					c.log.Info("kafka refused an offset commit for this member's epoch; ignored, the offset stored in postgres is the truth",
						"topic", topic, "partition", p.Partition, "member_epoch", req.Generation, "err", perr)
				}
			default:
				if first == nil {
					first = perr
				}
				if ok, held := c.repeats.allow(fmt.Sprint("commit", topic, p.Partition, perr), time.Now()); ok {
					c.log.Warn("commit offset to kafka; the offset stored in postgres is not affected",
						"topic", topic, "partition", p.Partition, "err", perr, "repeated", held)
				}
			}
		}
	}
	return first
}

// commitMarked synchronously commits the marked offsets, logging what
// failed through commitDone, and returns its error.
func (c *Consumer) commitMarked(ctx context.Context, cl *kgo.Client) error {
	var rerr error
	cl.CommitOffsetsSync(ctx, cl.MarkedOffsets(), func(cl *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		rerr = c.commitDone(cl, req, resp, err)
	})
	return rerr
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
