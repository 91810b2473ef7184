// The poll loop and fetch routing: poll takes what franz-go has fetched,
// route queues each partition's records to its worker (or pauses the
// partition), and the fetch settings and counter the client is built with.

package processor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fetchMaxWait is how long the broker may hold a fetch open waiting for
// data (the Java consumer's fetch.max.wait.ms, 500ms; franz-go's default
// is 5s). A partition resumed after a full queue is only fetched again by
// the next request, so this bounds how long a resumed partition sits idle
// behind a long poll of the member's partitions that have nothing new —
// and a partition far behind while the member's others are caught up
// (after a rebalance or a crash) pauses and resumes at every high water:
// at 500ms it caught up at ~7 k records/s, a high water per long poll
// (benchmarks/PROFILE.md). The cost is an empty fetch per broker every
// 100ms from a member with nothing to read.
const fetchMaxWait = 100 * time.Millisecond

// pollWait bounds one poll, so the loop also takes fenced
// partitions again when nothing arrives.
const pollWait = 500 * time.Millisecond

// poll is the poll loop. It never blocks on a worker: records are queued
// to their partition's worker, and a partition whose queue is full is
// paused (its backlog stays in Kafka) until the worker catches up.
//
// Each poll takes everything franz-go has buffered. Taking less would
// leave the rest of a response buffered, and franz-go drops a paused
// partition's buffered records when it is next polled, to fetch (and
// decompress) them again after it resumes: with a poll of a few batches
// and fetches of a megabyte a partition, a backlog was decoded five times
// over (TestBacklogIsFetchedOnce). What it costs is memory: a queue grows
// past its high water by one decompressed share ("Memory" in the package
// doc).
func (c *Consumer) poll(ctx context.Context, cl *kgo.Client) {
	readdedAt := map[string]time.Time{} // when each topic was last purged and added again
	for {
		pctx, cancel := context.WithTimeout(ctx, pollWait)
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return
		}
		var gone []string // topics whose id the brokers no longer know
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if errors.Is(err, kerr.UnknownTopicID) && !slices.Contains(gone, topic) {
				gone = append(gone, topic)
			}
			if isOutOfRange(err) {
				c.noteOutOfRange(tp{topic, partition}) // said once its log's bounds are read
				return
			}
			// Said once per repeatWindow per partition and error: a
			// deleted or refused topic fails every poll.
			if ok, held := c.repeats.allow(fmt.Sprint("fetch", topic, partition, err), time.Now()); ok {
				c.log.Warn("fetch error", "topic", topic, "partition", partition, "err", err, "repeated", held)
			}
		})
		fetches.EachPartition(c.route)
		c.retakeDue(ctx, cl)
		c.resetDue(cl)
		c.readd(cl, gone, c.recreatedTopics(), readdedAt)
		cl.AllowRebalance()
	}
}

// route hands one partition's fetched records to its worker.
func (c *Consumer) route(p kgo.FetchTopicPartition) {
	if len(p.Records) == 0 {
		return
	}
	k := tp{p.Topic, p.Partition}
	c.mu.Lock()
	part := c.parts[k]
	var w *worker
	if part != nil {
		// Under read committed the end of what can be read is the last
		// stable offset; a broker before Kafka 0.11 gives none (-1).
		part.hw = p.HighWatermark
		if p.LastStableOffset >= 0 {
			part.hw = min(p.HighWatermark, p.LastStableOffset)
		}
		w = part.w
		part.fetched = p.Records[len(p.Records)-1].Offset + 1
	}
	c.mu.Unlock()
	switch {
	case part == nil:
		return // revoked since the fetch; the next owner reads them
	case w == nil:
		// Fenced or out of range: nothing may be written from these.
		c.cl.PauseFetchPartitions(map[string][]int32{k.topic: {k.partition}})
		return
	}
	data := 0
	for _, r := range p.Records {
		if !r.Attrs.IsControl() {
			data++
		}
	}
	c.stats.records.Add(int64(data))
	w.enqueue(p.Records)
}

// fetchCounter counts the records franz-go decodes from fetch responses
// (Stats.RecordsFetched).
type fetchCounter struct{ n *atomic.Int64 }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (f fetchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.n.Add(int64(m.NumRecords))
}
