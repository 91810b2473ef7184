package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/members"
)

// The edge faults: latency on the Postgres link while a burst of bad
// records is isolated (pg-latency), and the topic deleted and created
// again under the running members (recreate), whose new topic has poison
// at offsets where the old one had dead letters. Each has its own check
// in the verdict, on top of the verdict's count of every record.

// latencyOutcome is what the pg-latency fault saw.
type latencyOutcome struct {
	Partition int32
	Lo, Hi    int64         // the burst's first and last offsets
	Records   int           // in the burst
	Isolated  int           // of them dead letters when the fault ended
	Took      time.Duration // from the burst's acknowledgement to its last dead letter; -1: not within Bound
	Bound     time.Duration
	Latency   time.Duration // each way
	Err       error         // the fault could not be carried out
}

// recreateOutcome is what the recreate fault saw.
type recreateOutcome struct {
	Failed             string // why the check failed before the topic was recreated, or ""
	OldParts, NewParts int
	TopicID            string        // the new topic's id
	Old                []landed      // the old topic's records, read before it was deleted
	DLMark             int64         // the highest dead_letters id before the deletion
	Reused             []pos         // the new topic's poison at offsets where the old topic had a dead letter
	Consumed           time.Duration // until the members that ran at the recreate stored the new topic's end offsets; -1: not within Bound
	Behind             string        // the partitions that were not, when Consumed is -1
	Bound              time.Duration
	Started, Exited    []string // members started, or exited, while the consumption was awaited
	// Then growBy partitions are added to the new topic (GrownParts in
	// all), and its end offsets, taken growSettle later, must be stored
	// within Bound too (Grown; -1: not; GrowBehind: the partitions that
	// were not, GrowFailed: why it could not be done).
	GrownParts int
	Grown      time.Duration
	GrowBehind string
	GrowFailed string
}

// growBy is how many partitions the recreate fault adds to the new topic
// once its records are consumed: partitions added under running members
// must be assigned and consumed (under classic the group's leader
// rebalances when its client's metadata shows them); growSettle is how
// long the producer spreads records over them before the end offsets the
// members must reach are taken.
const (
	growBy     = 2
	growSettle = 3 * time.Second
)

// runLatency carries out a pg-latency fault; the other faults wait for
// it, so that what it measures is the isolation, not a broker down or a
// group stopped meanwhile. It lets the burst's partition catch up, adds
// f.Latency to both directions of the Postgres link, publishes the burst
// on that partition, and waits, up to f.Pause, until every record of it
// is a dead letter. A batch holding the burst is isolated under
// savepoints, each of them round trips through the latency: an isolation
// that must finish within one tx_timeout, or starts again from scratch
// after one, never gets through.
func (c *chaos) runLatency(ctx context.Context, f fault, say func(string, ...any)) *latencyOutcome {
	out := &latencyOutcome{Partition: int32(f.Target % c.parts), Records: len(c.w.Burst), Bound: f.Pause, Latency: f.Latency, Took: -1}
	if !waitUp(ctx, c.pgUp) || !waitUp(ctx, c.brokerUp) {
		out.Err = ctx.Err()
		return out
	}
	ids := make([]string, len(c.w.Burst))
	for i := range c.w.Burst {
		c.w.Burst[i].Partition = out.Partition
		ids[i] = c.w.Burst[i].ID.String()
	}
	// The clock runs from the burst's publication: the partition catches
	// up first (a replay may have rewound it), so that what it measures is
	// the isolation, not a backlog.
	if ends, err := endOffsets(ctx, c.svc.brokers(), c.topic); err == nil {
		ends = map[int32]int64{out.Partition: ends[out.Partition]}
		if took, behind := c.waitStored(ctx, c.incarnation().TopicID, ends, latencyCatchUp); took < 0 {
			say("pg-latency: partition %d did not catch up within %v (%s); the burst goes anyway", out.Partition, latencyCatchUp, behind)
		}
	}
	remove, err := c.proxy.addLatency(f.Latency)
	if err != nil {
		out.Err = err
		say("pg-latency: %v", err)
		return out
	}
	defer func() {
		if err := remove(); err != nil {
			say("pg-latency: %v", err)
			return
		}
		say("pg-latency: latency removed")
	}()
	say("pg-latency: %v each way on the postgres link; %d records a handler refuses (an item of %d characters, SQLSTATE 54000) published in a row to partition %d",
		f.Latency, len(ids), burstItem, out.Partition)
	// The producer pauses for the burst, so that its records are in a row.
	burst := make([]*record, len(c.w.Burst))
	for i := range c.w.Burst {
		burst[i] = &c.w.Burst[i]
	}
	err = c.prod.pause(ctx)
	if err == nil {
		err = publishPaused(ctx, c.prod, c.topic, burst, c.led)
	}
	c.prod.resume()
	if err != nil {
		out.Err = fmt.Errorf("publish the burst: %w", err)
		say("pg-latency: %v", out.Err)
		return out
	}
	out.Lo, out.Hi = -1, -1
	for i := range c.w.Burst {
		if s, ok := c.led.answerOf(c.w.Burst[i].Seq); ok && s.Acked {
			if out.Lo < 0 || s.Offset < out.Lo {
				out.Lo = s.Offset
			}
			out.Hi = max(out.Hi, s.Offset)
		}
	}
	say("pg-latency: the burst is at offsets %d–%d of partition %d", out.Lo, out.Hi, out.Partition)
	t0, lastSay := time.Now(), time.Now()
	for {
		n, err := countDeadLetters(ctx, c.admin, c.group, c.topic, ids)
		if err == nil {
			out.Isolated = n
		}
		switch {
		case out.Isolated == len(ids):
			out.Took = time.Since(t0)
			say("pg-latency: the %d records are dead letters %v after they were acknowledged", n, out.Took.Round(time.Millisecond))
			return out
		case time.Since(t0) > f.Pause || ctx.Err() != nil:
			say("pg-latency: %d of %d records are dead letters %v after they were acknowledged: the isolation did not get through",
				out.Isolated, len(ids), f.Pause)
			return out
		case time.Since(lastSay) >= 10*time.Second:
			lastSay = time.Now()
			say("pg-latency: %d of %d dead letters after %v%s", out.Isolated, len(ids), time.Since(t0).Round(time.Second), errSuffix(err))
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

// recreate carries out a recreate fault; the other faults wait for it.
// Records the broker deletes with a topic are lost by Kafka, not by
// onceflow, so none may be waiting: the producer is paused until every
// record sent is consumed (stored offsets at the end offsets), the old
// topic is read back for the verdict, then deleted and created again,
// with f.N more partitions. Its first records are a prefix on the
// partition whose dead letters came first: a poison record at each offset
// of the old topic's first dead letters there, a redelivery of an old
// good event at each other offset. Then the producer goes on, into the
// new topic, while no member starts (a restart would hide a member that
// cannot follow the new topic), and the new topic's end offsets, taken a
// second later, must be stored under its topic id within f.Pause.
func (c *chaos) recreate(ctx context.Context, f fault, say func(string, ...any)) {
	out := &recreateOutcome{OldParts: c.parts, NewParts: c.parts + f.N, Consumed: -1, Bound: f.Pause}
	c.rec = out
	if !waitUp(ctx, c.pgUp) || !waitUp(ctx, c.brokerUp) {
		return
	}
	say("recreate: the producer pauses; waiting for every record sent to be consumed")
	err := c.prod.pause(ctx)
	paused := true
	resume := func() {
		if paused {
			paused = false
			c.prod.resume()
		}
	}
	defer resume()
	if err != nil {
		out.Failed = fmt.Sprintf("the producer's records were not all answered: %v", err)
		say("recreate: %s", out.Failed)
		return
	}
	ends, err := endOffsets(ctx, c.svc.brokers(), c.topic)
	if err != nil {
		out.Failed = err.Error()
		say("recreate: %s", out.Failed)
		return
	}
	took, behind := c.waitStored(ctx, "", ends, recreateDrain)
	if took < 0 {
		out.Failed = fmt.Sprintf("with the producer paused, partitions did not reach their end within %v (%s): the topic was not recreated", recreateDrain, behind)
		say("recreate: %s", out.Failed)
		return
	}
	say("recreate: every partition at its end after %v", took.Round(time.Millisecond))
	if out.Old, _, err = readTopic(ctx, c.svc.brokers(), c.topic, c.parts, 0); err != nil {
		out.Failed = err.Error()
		say("recreate: %s", out.Failed)
		return
	}
	var oldDL []pos
	if out.DLMark, oldDL, err = deadLetterMark(ctx, c.admin, c.group, c.topic); err != nil {
		out.Failed = err.Error()
		say("recreate: %s", out.Failed)
		return
	}

	release := c.members.hold()
	defer release()
	before := procNames(c.members.running())
	id, err := recreateTopic(ctx, c.svc.brokers(), c.topic, out.NewParts)
	if err != nil {
		out.Failed = err.Error()
		say("recreate: %s", out.Failed)
		return
	}
	out.TopicID = id.String()
	c.parts, c.inc = out.NewParts, 1
	if err := c.prod.renew(out.NewParts); err != nil {
		out.Failed = err.Error()
		say("recreate: %s", out.Failed)
		return
	}
	prefix := c.reusePrefix(oldDL, out.Old)
	if err := publishPaused(ctx, c.prod, c.topic, prefix, c.led); err != nil {
		say("recreate: the prefix: %v", err)
	}
	wasDL := map[pos]bool{}
	for _, at := range oldDL {
		wasDL[at] = true
	}
	for _, r := range prefix {
		if s, ok := c.led.answerOf(r.Seq); ok && s.Acked && r.poison() && wasDL[pos{s.Partition, s.Offset, 0}] {
			out.Reused = append(out.Reused, pos{s.Partition, s.Offset, 1})
		}
	}
	say("recreate: topic %s deleted and created again (id %s) with %d partitions (%d before); its first %d records hold %d poison records at offsets where the old topic had a dead letter: %v",
		c.topic, out.TopicID, out.NewParts, out.OldParts, len(prefix), len(out.Reused), out.Reused)
	resume()

	if !sleepCtx(ctx, time.Second) {
		return
	}
	if ends, err = endOffsets(ctx, c.svc.brokers(), c.topic); err != nil {
		say("recreate: %v", err)
		return
	}
	out.Consumed, out.Behind = c.waitStored(ctx, out.TopicID, ends, f.Pause)
	after := procNames(c.members.running())
	for _, n := range after {
		if !slices.Contains(before, n) {
			out.Started = append(out.Started, n)
		}
	}
	for _, n := range before {
		if !slices.Contains(after, n) {
			out.Exited = append(out.Exited, n)
		}
	}
	if out.Consumed < 0 {
		say("recreate: the members running (%s) did not store the new topic's end offsets %v within %v: behind: %s",
			strings.Join(before, ", "), ends, f.Pause, out.Behind)
	} else {
		say("recreate: the members running (%s) stored the new topic's end offsets %v after %v",
			strings.Join(before, ", "), ends, out.Consumed.Round(time.Millisecond))
	}
	if len(out.Started)+len(out.Exited) > 0 {
		say("recreate: meanwhile started: %v, exited: %v", out.Started, out.Exited)
	}
	if out.Consumed >= 0 {
		c.grow(ctx, out, f, say)
	}
}

// grow adds growBy partitions to the recreated topic under the running
// members (none starts meanwhile: the caller holds them) and waits, up to
// f.Pause, for the end offsets taken growSettle later to be stored.
func (c *chaos) grow(ctx context.Context, out *recreateOutcome, f fault, say func(string, ...any)) {
	out.GrownParts, out.Grown = c.parts+growBy, -1
	err := c.prod.pause(ctx)
	if err == nil {
		err = addPartitions(ctx, c.svc.brokers(), c.topic, out.GrownParts)
	}
	if err == nil {
		err = c.prod.grow(out.GrownParts)
	}
	if err == nil {
		c.parts = out.GrownParts
	}
	c.prod.resume()
	if err != nil {
		out.GrowFailed = err.Error()
		say("grow: %s", out.GrowFailed)
		return
	}
	say("grow: %d partitions added to topic %s (%d now); the producer spreads records over them", growBy, c.topic, out.GrownParts)
	if !sleepCtx(ctx, growSettle) {
		return
	}
	ends, err := endOffsets(ctx, c.svc.brokers(), c.topic)
	if err != nil {
		out.GrowFailed = err.Error()
		say("grow: %v", err)
		return
	}
	out.Grown, out.GrowBehind = c.waitStored(ctx, out.TopicID, ends, f.Pause)
	if out.Grown < 0 {
		say("grow: the members did not store the grown topic's end offsets %v within %v: behind: %s", ends, f.Pause, out.GrowBehind)
	} else {
		say("grow: the members stored the grown topic's end offsets %v after %v", ends, out.Grown.Round(time.Millisecond))
	}
}

// reusePrefix builds the new topic's first records: on each partition
// whose first dead letter is at most reuseWithin, a poison record at the
// offset of each of its first two dead letters within reuseWithin, and a
// redelivery of an old good event at every offset before or between them.
// They are in the ledger, not yet published.
func (c *chaos) reusePrefix(oldDL []pos, old []landed) []*record {
	var good []*record
	for _, l := range old {
		if r, ok := c.led.record(l.Seq); ok && !r.poison() {
			good = append(good, r)
		}
	}
	if len(good) == 0 {
		return nil
	}
	reuse := map[int32][]int64{}
	for _, at := range sortedPos(setOf(oldDL)) {
		if at.Offset <= reuseWithin && len(reuse[at.Partition]) < 2 {
			reuse[at.Partition] = append(reuse[at.Partition], at.Offset)
		}
	}
	rng := rand.New(rand.NewPCG(c.o.seed, 0x7265757365)) // "reuse"
	kinds := []string{"bad-json", "rejected", "data-error", "no-id"}
	var out []*record
	k, g := 0, 0
	for _, part := range slices.Sorted(maps.Keys(reuse)) {
		offs := reuse[part]
		for off := int64(0); off <= offs[len(offs)-1]; off++ {
			var r record
			if slices.Contains(offs, off) {
				p, err := newPoison(rng, kinds[k%len(kinds)], k, c.o.maxRecord)
				if err != nil {
					continue // the kinds above build whatever the limit
				}
				r, k = p, k+1
			} else {
				r, g = *good[g%len(good)], g+1
				r.Kind, r.ResendOf = kindRedelivery, 0
			}
			r.Partition = part
			out = append(out, c.led.add(r))
		}
	}
	return out
}

// reuseWithin bounds the offsets of the old dead letters the new topic's
// poison reuses, and so the redeliveries written before them.
const reuseWithin = 600

func setOf(ps []pos) map[pos]bool {
	m := make(map[pos]bool, len(ps))
	for _, p := range ps {
		m[p] = true
	}
	return m
}

// waitStored waits, up to bound, until every partition's stored offset
// (of topic id topicID, or of any when it is "") is at least its end in
// ends, and returns how long that took, or -1 and the partitions behind.
func (c *chaos) waitStored(ctx context.Context, topicID string, ends map[int32]int64, bound time.Duration) (time.Duration, string) {
	start := time.Now()
	for {
		stored, err := members.StoredOffsets(ctx, c.admin, schema, c.group, c.topic, topicID)
		var behind []string
		if err != nil {
			behind = []string{err.Error()}
		}
		for _, p := range slices.Sorted(maps.Keys(ends)) {
			if s, ok := stored[p]; ends[p] > 0 && (!ok || s < ends[p]) {
				if !ok {
					s = -1
				}
				behind = append(behind, fmt.Sprintf("%d at %d/%d", p, s, ends[p]))
			}
		}
		if len(behind) == 0 {
			return time.Since(start), ""
		}
		if time.Since(start) > bound || !sleepCtx(ctx, 250*time.Millisecond) {
			return -1, strings.Join(behind, ", ")
		}
	}
}

// countDeadLetters counts the events of ids with a dead letter of group
// and topic.
func countDeadLetters(ctx context.Context, pool *pgxpool.Pool, group, topic string, ids []string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+`
WHERE consumer_group = $1 AND topic = $2 AND event_id = ANY($3::uuid[])`, group, topic, ids).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// deadLetterMark returns the highest dead_letters id and where the dead
// letters of group and topic are.
func deadLetterMark(ctx context.Context, pool *pgxpool.Pool, group, topic string) (int64, []pos, error) {
	t := pgx.Identifier{schema, "dead_letters"}.Sanitize()
	var mark int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+t).Scan(&mark); err != nil {
		return 0, nil, fmt.Errorf("read dead_letters: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT partition, "offset" FROM `+t+` WHERE consumer_group = $1 AND topic = $2`, group, topic)
	if err != nil {
		return 0, nil, fmt.Errorf("read dead_letters: %w", err)
	}
	var out []pos
	var at pos
	if _, err := pgx.ForEachRow(rows, []any{&at.Partition, &at.Offset}, func() error { out = append(out, at); return nil }); err != nil {
		return 0, nil, fmt.Errorf("read dead_letters: %w", err)
	}
	return mark, out, nil
}

func procNames(ps []*proc) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.name
	}
	return out
}

// edgeFailures lists the edge faults' checks that failed.
func (c *chaos) edgeFailures() []string {
	var out []string
	if l := c.lat; l != nil {
		switch {
		case l.Err != nil:
			out = append(out, fmt.Sprintf("pg-latency: %v", l.Err))
		case l.Took < 0:
			out = append(out, fmt.Sprintf("pg-latency: %d of %d records a handler refuses, in a row on partition %d, were dead letters %v after their publication, with %v each way on the postgres link: the isolation did not get through",
				l.Isolated, l.Records, l.Partition, l.Bound, l.Latency))
		}
	}
	if r := c.rec; r != nil {
		switch {
		case r.Failed != "":
			out = append(out, "recreate: "+r.Failed)
		case r.Consumed < 0:
			out = append(out, fmt.Sprintf("recreate: the members that ran when the topic was created again (id %s) did not store its end offsets within %v: behind: %s",
				r.TopicID, r.Bound, r.Behind))
		case r.GrowFailed != "":
			out = append(out, "grow: "+r.GrowFailed)
		case r.Grown < 0:
			out = append(out, fmt.Sprintf("grow: the members did not store the end offsets of the topic grown to %d partitions within %v: behind: %s",
				r.GrownParts, r.Bound, r.GrowBehind))
		}
	}
	return out
}

// reusedOK counts the new topic's poison at offsets of old dead letters
// that are dead letters once (of the new topic).
func reusedOK(r *recreateOutcome, o *observed) int {
	n := 0
	for _, at := range r.Reused {
		if o.DeadLetters[at].Count == 1 {
			n++
		}
	}
	return n
}
