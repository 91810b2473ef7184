// A fetch the brokers answer OFFSET_OUT_OF_RANGE while a worker consumes:
// the log start passed what the member had fetched (retention, or
// DeleteRecords, deleted records it had not read), or the log now ends
// before it. The client is built not to reset such a partition itself
// (kgo.NoResetOffset): the poll loop pauses its fetching and notes it
// (noteOutOfRange); the broker watch reads the log's bounds, says and
// counts the finding, and follows kafka.offset_out_of_range
// (settleOutOfRange): ResumeAtLogStart has the poll loop move the
// partition's fetching to the log start (resetDue), PauseOnOutOfRange has
// the worker write what it fetched before and then leaves the partition
// paused, as one whose stored offset is out of range at assignment
// (endedAfterQueue), until its offsets are reset.

package processor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
)

// noteOutOfRange pauses partition k's fetching and, when a worker reads
// it and nothing is noted yet, notes it for the broker watch. Called by
// the poll loop.
func (c *Consumer) noteOutOfRange(k tp) {
	c.cl.PauseFetchPartitions(map[string][]int32{k.topic: {k.partition}})
	c.mu.Lock()
	defer c.mu.Unlock()
	if part := c.parts[k]; part != nil && part.w != nil && !part.outOfRange && part.resetTo < 0 {
		part.outOfRange = true
	}
}

// settleOutOfRange reads the log bounds of the partitions noted by
// noteOutOfRange, says and counts each finding, and follows the policy.
// A partition whose bounds the brokers do not give stays noted, for the
// next look. Called by the broker watch.
func (c *Consumer) settleOutOfRange(ctx context.Context) {
	type noted struct {
		w  *worker
		at int64 // where the member was fetching: the offset after the last record fetched
	}
	due := map[string]map[int32]noted{}
	c.mu.Lock()
	for k, part := range c.parts {
		if !part.outOfRange || part.w == nil {
			continue
		}
		if due[k.topic] == nil {
			due[k.topic] = map[int32]noted{}
		}
		at := part.fetched
		if at == 0 {
			at = part.w.next.Load()
		}
		due[k.topic][k.partition] = noted{part.w, at}
	}
	c.mu.Unlock()
	for topic, ps := range due {
		asked := map[int32]sink.Lease{}
		for p := range ps {
			asked[p] = sink.Lease{NextOffset: -1}
		}
		bounds := c.logBounds(ctx, topic, asked)
		for p, n := range ps {
			b := bounds[p]
			if !b.known {
				continue
			}
			k := tp{topic, p}
			where := "below the log start: the records in between were deleted (retention, or DeleteRecords) before the group read them, and are not applied"
			switch {
			case n.at > b.end:
				where = "beyond the log end"
			case n.at >= b.start:
				where = "" // in the log again (the answer was stale): fetch from there
			}
			// The policy is for offsets Postgres stores: one the group
			// committed in Kafka only (another consumer's, or before this
			// schema) is a hint, and goes to the log start, as a member
			// with no offset at all starts.
			stored := n.w.stored.Load()
			pause := c.cfg.OffsetOutOfRange == PauseOnOutOfRange && stored
			var action string
			switch {
			case pause:
				action = "the records fetched before are written, then the partition stays paused (kafka.offset_out_of_range: pause) until its offsets are reset"
			case !stored:
				action = "Postgres stores no offset for the partition (the offset was the group's committed one in Kafka): consuming from the log start"
			default:
				action = "consuming from the log start (kafka.offset_out_of_range: earliest)"
			}
			c.mu.Lock()
			part := c.parts[k]
			if part == nil || part.w != n.w || !part.outOfRange {
				c.mu.Unlock()
				continue // revoked, or taken again, meanwhile
			}
			part.outOfRange = false
			switch {
			case where == "":
				part.resetTo = n.at
			case pause:
				part.start, part.hw = b.start, max(part.hw, b.stable)
				n.w.endAfterQueue()
			default:
				part.resetTo = b.start
			}
			c.mu.Unlock()
			if where != "" && c.firstFinding(k, fmt.Sprint("fetch ", n.at, " ", b.start, " ", b.end)) {
				c.stats.outOfRange.Add(1)
				c.log.Error("fetch offset is "+where+"; "+action, "topic", topic, "partition", p,
					"fetch_offset", n.at, "log_start", b.start, "log_end", b.end)
			}
		}
	}
}

// resetDue moves the fetching of the partitions settleOutOfRange set a
// reset for to that offset and resumes it, when the same worker still
// reads them. It runs in the poll loop, before AllowRebalance, so that
// the seek cannot race a revoke.
func (c *Consumer) resetDue(cl *kgo.Client) {
	seek := map[string]map[int32]kgo.EpochOffset{}
	c.mu.Lock()
	for k, part := range c.parts {
		if part.resetTo < 0 {
			continue
		}
		if part.w != nil {
			if seek[k.topic] == nil {
				seek[k.topic] = map[int32]kgo.EpochOffset{}
			}
			seek[k.topic][k.partition] = kgo.EpochOffset{Epoch: -1, Offset: part.resetTo}
			part.fetched = part.resetTo
		}
		part.resetTo = -1
	}
	c.mu.Unlock()
	if len(seek) == 0 {
		return
	}
	cl.SetOffsets(seek)
	resume := map[string][]int32{}
	for topic, ps := range seek {
		for p := range ps {
			resume[topic] = append(resume[topic], p)
		}
		slices.Sort(resume[topic])
	}
	cl.ResumeFetchPartitions(resume)
}

// endedAfterQueue leaves w's partition paused, with no worker, once w has
// written what it had fetched before its fetch offset fell out of range
// (PauseOnOutOfRange): as a partition whose stored offset is out of range
// at assignment, it waits for its offsets to be reset.
func (c *Consumer) endedAfterQueue(w *worker) { c.detach(w, time.Time{}) }

// isOutOfRange reports whether a fetch error is the brokers' answer to a
// fetch offset outside the partition's log.
func isOutOfRange(err error) bool { return errors.Is(err, kerr.OffsetOutOfRange) }
