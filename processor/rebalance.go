// The group's callbacks: partitions assigned (taken in Postgres with a new
// epoch, each started where its stored offset says), taken again after a
// fence, revoked (drained, offsets committed) and lost (aborted); and the
// stopping of their workers.

package processor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
)

// assigned is called before the offsets of new partitions are fetched;
// the partitions are taken in adjust, once their Kafka offsets are known.
// It logs each topic's partitions once each, in order (franz-go has listed
// some twice, assigning a topic re-added with more partitions).
func (c *Consumer) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	c.refused.Store(nil) // admitted to the group
	for topic, parts := range assigned {
		if len(parts) > 0 {
			c.log.Info("partitions assigned", "topic", topic, "partitions", slices.Compact(slices.Sorted(slices.Values(parts))))
		}
	}
}

// adjust takes the newly assigned partitions in Postgres (a new epoch
// each, which fences any earlier owner), decides where each starts — the
// offset stored in Postgres whenever there is one, whatever Kafka has
// committed — and starts their workers. It waits for Postgres as long as
// the assignment lasts.
//
// A partition that resumes from its stored offset while the group's
// committed offset in Kafka is behind it, or absent (a commit refused
// with UNKNOWN_MEMBER_ID or lost in a crash), has that offset marked for
// commit at once: the next commit of this member (in the background, on
// revoke or on shutdown, under its generation or member epoch) brings
// Kafka's committed offset up to what Postgres holds, new records or
// none. A mark never moves back, so a batch's later mark is never undone;
// a commit the broker refuses (this member no longer owns the partition)
// is logged as any other (commitDone) and changes nothing in Postgres.
// An offset Kafka is ahead of is not committed back.
func (c *Consumer) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	select {
	case <-c.clientSet: // c.cl is used below
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	catchUp := map[string]map[int32]kgo.EpochOffset{}
	for _, topic := range slices.Sorted(maps.Keys(offsets)) {
		parts := offsets[topic]
		ps := slices.Sorted(maps.Keys(parts))
		// A topic purged and added again (readd) can be assigned again
		// with no revoke between: a worker still running for one of
		// these partitions stops first.
		c.stats.revoked.Add(int64(c.stop(map[string][]int32{topic: ps}, c.aborting.Load())))
		id := c.topicID(ctx, topic)
		leases, err := c.take(ctx, topic, ps)
		if err != nil {
			return nil, err // the assignment is being revoked
		}
		bounds := c.logBounds(ctx, topic, leases)
		for _, p := range ps {
			if c.start(topic, p, leases[p], parts, bounds[p], id) {
				if catchUp[topic] == nil {
					catchUp[topic] = map[int32]kgo.EpochOffset{}
				}
				catchUp[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: leases[p].NextOffset}
			}
		}
	}
	// During an assignment's offset fetch, franz-go records a SetOffsets
	// as the partitions' start (the same as returned) and as their marked
	// offsets, which its next commit sends over the commits it fetched.
	// Set only once every topic is started: when adjust fails (the
	// assignment is being revoked), no seek of it is left for a retried
	// fetch to apply over that retry's own decision.
	c.cl.SetOffsets(catchUp)
	return offsets, nil
}

// start decides where partition p of topic starts, sets it in parts, and
// starts its worker (or leaves it paused when its stored offset is out of
// range and the policy says so). It reports whether the partition resumes
// from its stored offset and Kafka's committed offset is behind it (or
// absent): that offset is then to be committed to Kafka (see adjust).
func (c *Consumer) start(topic string, p int32, l sink.Lease, parts map[int32]kgo.Offset, b logBounds, id uuid.NullUUID) (catchUp bool) {
	k := tp{topic, p}
	next := int64(-1)
	paused := false
	if s := l.NextOffset; s >= 0 {
		next = s
		recreated := id.Valid && l.TopicID.Valid && id.UUID != l.TopicID.UUID
		if recreated || b.known && (s < b.start || s > b.end) {
			where := "below the log start: the records in between were deleted (retention, or DeleteRecords) and are not applied"
			switch {
			case recreated:
				where = "of a topic deleted since and recreated under the same name (its topic id changed from " +
					l.TopicID.UUID.String() + " to " + id.UUID.String() + ")"
			case s > b.end:
				where = "beyond the log end: the topic was probably deleted and recreated"
			}
			action := "consuming from the log start (kafka.offset_out_of_range: earliest)"
			if c.cfg.OffsetOutOfRange == PauseOnOutOfRange {
				action = "the partition stays paused (kafka.offset_out_of_range: pause) until its offsets are reset"
				paused = true
			} else {
				next = b.start // 0 when the bounds are unknown: the log start of a new topic
			}
			// Said and counted once per finding: the same partition taken
			// again with the same stored offset (under the consumer
			// protocol, assigned before and after a recreated topic is
			// re-added) is the same finding, whatever the log's bounds
			// then. Another member that takes it finds it too.
			if c.firstFinding(k, fmt.Sprint(s, l.TopicID, id)) {
				c.stats.outOfRange.Add(1)
				c.log.Error("stored offset is "+where+"; "+action, "topic", topic, "partition", p,
					"stored_offset", s, "log_start", b.start, "log_end", b.end)
			}
		}
		committed := parts[p].EpochOffset().Offset
		parts[p] = kgo.NewOffset().At(next).WithEpoch(-1)
		if recreated && !b.known && !paused {
			parts[p] = kgo.NewOffset().AtStart()
		}
		// committed is negative when Kafka has no commit (the reset
		// offset stands in for it).
		catchUp = !paused && !recreated && next == s && s > committed
		switch {
		case paused: // said above
		case catchUp:
			c.log.Info("resuming from the offset stored in postgres; committing it to kafka, whose committed offset is behind",
				"topic", topic, "partition", p, "offset", next, "kafka_committed", committed)
		case next != committed:
			c.log.Info("resuming from the offset stored in postgres", "topic", topic, "partition", p,
				"offset", next, "kafka_committed", committed)
		}
	} else if off := parts[p].EpochOffset().Offset; off >= 0 {
		next = off
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	part := &partition{hw: -1, resetTo: -1}
	if b.known {
		part.hw, part.start = b.stable, b.start
	}
	c.parts[k] = part
	c.stats.assigned.Add(1)
	if paused {
		c.cl.PauseFetchPartitions(map[string][]int32{topic: {p}})
		return false
	}
	part.w = c.newWorker(k, l, next)
	c.cl.ResumeFetchPartitions(map[string][]int32{topic: {p}})
	return catchUp
}

// take takes partitions in Postgres, retrying with backoff until it
// succeeds or ctx ends.
func (c *Consumer) take(ctx context.Context, topic string, ps []int32) (map[int32]sink.Lease, error) {
	backoff := c.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		leases, err := c.writer.Take(tctx, topic, ps)
		cancel()
		if err == nil {
			return leases, nil
		}
		c.log.Warn("take partitions in postgres; waiting for it", "topic", topic, "partitions", ps, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, c.cfg.MaxRetryBackoff)
	}
}

// retakeDue takes again, after a fence, the partitions still assigned to
// this member: by then a zombie that fenced this member has learned from
// the group that it lost them. It runs in the poll loop, before
// AllowRebalance, so seeking cannot race a revoke.
func (c *Consumer) retakeDue(ctx context.Context, cl *kgo.Client) {
	now := time.Now()
	var due []tp
	c.mu.Lock()
	for k, p := range c.parts {
		if p.w == nil && !p.retakeAt.IsZero() && now.After(p.retakeAt) {
			due = append(due, k)
		}
	}
	c.mu.Unlock()
	for _, k := range due {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		leases, err := c.writer.Take(tctx, k.topic, []int32{k.partition})
		var start int64
		if err == nil {
			start, err = c.restartOffset(tctx, cl, k, leases[k.partition])
		}
		cancel()
		c.mu.Lock()
		part := c.parts[k]
		if part == nil || part.w != nil {
			c.mu.Unlock()
			continue // revoked meanwhile
		}
		if err != nil {
			part.retakeAt = time.Now().Add(c.cfg.MaxRetryBackoff)
			c.mu.Unlock()
			c.log.Warn("take partition again after a fence", "topic", k.topic, "partition", k.partition, "err", err)
			continue
		}
		part.retakeAt, part.fetched = time.Time{}, 0
		part.w = c.newWorker(k, leases[k.partition], start)
		c.mu.Unlock()
		cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{k.topic: {k.partition: {Epoch: -1, Offset: start}}})
		cl.ResumeFetchPartitions(map[string][]int32{k.topic: {k.partition}})
		c.log.Info("partition taken again after a fence", "topic", k.topic, "partition", k.partition,
			"offset", start, "epoch", leases[k.partition].Epoch)
	}
}

// revoked stops the workers of revoked partitions (each finishes its
// in-flight batch within DrainTimeout, or is aborted), then commits the
// marked offsets before the rebalance goes on.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	n := c.stop(revoked, c.aborting.Load())
	c.stats.revoked.Add(int64(n))
	if c.aborting.Load() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	_ = c.commit(cctx, cl, "revoke") // logged by commitDone
	if n > 0 {
		c.log.Info("partitions revoked", "partitions", revoked)
	}
}

func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	n := c.stop(lost, true)
	c.stats.lost.Add(int64(n))
	if n > 0 {
		c.log.Warn("partitions lost; in-flight batches aborted, nothing committed", "partitions", lost)
	}
}

// stop forgets the given partitions and stops their workers; see
// stopWorkers.
func (c *Consumer) stop(parts map[string][]int32, abort bool) int {
	c.mu.Lock()
	var ws []*worker
	n := 0
	for topic, ps := range parts {
		for _, p := range ps {
			k := tp{topic, p}
			if part := c.parts[k]; part != nil {
				delete(c.parts, k)
				n++
				if part.w != nil {
					ws = append(ws, part.w)
				}
			}
		}
	}
	c.mu.Unlock()
	c.stopWorkers(ws, abort)
	return n
}

// stopWorkers stops workers and waits for them. Draining, each finishes the
// batch it is writing (none is started) until DrainTimeout, after which
// the rest are aborted; aborting, or after Abort, in-flight transactions
// are canceled at once.
func (c *Consumer) stopWorkers(ws []*worker, abort bool) {
	for _, w := range ws {
		if abort {
			w.cancel()
		}
		close(w.quit)
		time.AfterFunc(c.cfg.DrainTimeout/2, func() { close(w.settle) })
	}
	deadline := time.NewTimer(c.cfg.DrainTimeout)
	defer deadline.Stop()
	for _, w := range ws {
		select {
		case <-w.done:
		case <-deadline.C:
			c.log.Warn("drain timeout: aborting the batches still in flight", "drain_timeout", c.cfg.DrainTimeout)
			for _, w := range ws {
				w.cancel()
			}
			<-w.done
		case <-c.hard.Done(): // Abort
			<-w.done
		}
	}
}

// firstFinding reports whether finding is new for partition k: not the
// last one reported for it.
func (c *Consumer) firstFinding(k tp, finding string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.findings == nil {
		c.findings = map[tp]string{}
	}
	if c.findings[k] == finding {
		return false
	}
	c.findings[k] = finding
	return true
}
