// Watching the brokers and the consumed topics: readiness (watchBrokers),
// topics missing or refused (checkTopics), topic ids (topicID), and a topic
// deleted and recreated under the same name (readd).

package processor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/sink"
)

// kgoTopicRecreated is franz-go's line (once per client and recreation)
// when metadata gives a new id for a topic the client holds: from then on
// it fetches the topic under the old id, which the brokers answer with
// UNKNOWN_TOPIC_ID, and those errors reached the poll loop up to 25 s
// later (a chaos run). The Consumer re-adds the topic on this line, not
// only on the errors. Should franz-go word it otherwise, the errors still
// do (TestRecreatedTopicSaidByTheClient checks the words).
const kgoTopicRecreated = "metadata has a new ID for a topic we already hold: the topic was deleted and recreated; we do not adopt the new ID, the topic fails with UNKNOWN_TOPIC_ID until it is purged and re-added"

// noteRecreated records that the client saw topic recreated (kgoLogger).
func (c *Consumer) noteRecreated(topic string) {
	if !slices.Contains(c.cfg.Topics, topic) {
		return
	}
	c.recreatedMu.Lock()
	defer c.recreatedMu.Unlock()
	if c.recreated == nil {
		c.recreated = map[string]bool{}
	}
	c.recreated[topic] = true
}

// recreatedTopics returns the topics noteRecreated recorded and readd has
// not added again since, sorted.
func (c *Consumer) recreatedTopics() []string {
	c.recreatedMu.Lock()
	defer c.recreatedMu.Unlock()
	return slices.Sorted(maps.Keys(c.recreated))
}

// readdEvery is how often, at most, one topic is purged from the client
// and added again (readd): each time costs the group a rebalance, and the
// fetches in flight as it happens may still fail with the old id.
const readdEvery = 10 * time.Second

// readd purges from the client, and adds again, each consumed topic of
// gone: topics whose fetches fail with UNKNOWN_TOPIC_ID, which the brokers
// answer once the topic the client knows (by its Kafka topic id) is
// deleted — recreated under the same name or not yet — and each of
// recreated, those the client said it saw recreated (noteRecreated).
// franz-go keeps a topic's first id for the client's life and fails every
// fetch of a new one until the topic is purged and added again; then it
// learns the topic as new, by its name: a recreated topic is assigned
// again, and a topic not yet recreated is waited for, as one not created
// yet is.
//
// First the topic's workers stop, as on a revoke: the batch each is
// writing finishes (or is given up after DrainTimeout) under the old id
// and the old lease — records of the old topic, harmless — and the
// records queued behind it, which no member can read any more, are
// dropped. readd commits no Kafka offset (a revoke would): an offset of
// the old topic committed by name could land on the new one; franz-go
// drops the old topic's marks once it has seen it recreated, and the
// brokers refuse them for a deleted one. Whatever Kafka holds, the offset
// stored in Postgres, with its topic id, decides: when the group assigns
// the topic's partitions again, adjust takes each with a new lease, and
// an offset stored under the old topic id starts the partition from its
// log start, as any recreated topic's does; a partition with no stored
// offset (one the old topic did not have) starts from the log start too,
// unless the group has an offset committed for it in Kafka. A topic of
// gone is re-added at most once per readdEvery (fetches in flight as it
// is re-added may still fail with the old id); one the client said it saw
// recreated is re-added at once: the client says so once per id it held,
// so a topic recreated again soon after a re-add is not left unread for
// the rest of readdEvery. Called by the poll loop, before it allows a
// rebalance, so stopping workers cannot race a revoke.
func (c *Consumer) readd(cl *kgo.Client, gone, recreated []string, readdedAt map[string]time.Time) {
	now := time.Now()
	var topics []string
	for _, topic := range slices.Concat(recreated, gone) {
		if !slices.Contains(c.cfg.Topics, topic) || slices.Contains(topics, topic) ||
			now.Sub(readdedAt[topic]) < readdEvery && !slices.Contains(recreated, topic) {
			continue
		}
		readdedAt[topic] = now
		topics = append(topics, topic)
	}
	if len(topics) == 0 {
		return
	}
	stop := map[string][]int32{}
	c.mu.Lock()
	for k := range c.parts {
		if slices.Contains(topics, k.topic) {
			stop[k.topic] = append(stop[k.topic], k.partition)
		}
	}
	for _, topic := range topics {
		delete(c.topicIDs, topic)
	}
	c.mu.Unlock()
	c.recreatedMu.Lock()
	for _, topic := range topics {
		delete(c.recreated, topic)
	}
	c.recreatedMu.Unlock()
	for _, topic := range topics {
		c.log.Warn("consumed topic deleted, perhaps recreated under the same name (its topic id is unknown to the brokers): "+
			"its partitions' workers stop, and the topic is consumed again as new, a recreated topic from its start",
			"topic", topic, "partitions", stop[topic])
	}
	c.stats.revoked.Add(int64(c.stop(stop, c.aborting.Load())))
	cl.PurgeTopicsFromClient(topics...)
	cl.AddConsumeTopics(topics...)
}

// topicID returns topic's Kafka topic id, remembering it for the workers
// (they store it with each batch's offset); not Valid when the brokers do
// not answer within a few attempts (a topic just recreated can be unknown
// to some for a moment) or have no topic ids.
func (c *Consumer) topicID(ctx context.Context, topic string) uuid.NullUUID {
	var id uuid.NullUUID
	var err error
attempts:
	for attempt := 1; ; attempt++ {
		id, err = c.readTopicID(ctx, topic)
		if id.Valid || errors.Is(err, errNoTopicIDs) || attempt == 3 {
			break
		}
		select {
		case <-ctx.Done():
			break attempts
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	if !id.Valid {
		c.log.Warn("read the topic's id; a topic recreated under the same name is only detected by its offsets", "topic", topic, "err", err)
	}
	c.mu.Lock()
	c.topicIDs[topic] = id
	c.mu.Unlock()
	return id
}

// errNoTopicIDs: the brokers answer with no topic ids (Kafka before 2.8).
var errNoTopicIDs = errors.New("the brokers have no topic ids")

// readTopicID asks the brokers for topic's Kafka topic id, once.
func (c *Consumer) readTopicID(ctx context.Context, topic string) (uuid.NullUUID, error) {
	tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	details, err := kadm.NewClient(c.cl).ListTopics(tctx, topic)
	if err != nil {
		return uuid.NullUUID{}, err
	}
	d, ok := details[topic]
	switch {
	case !ok:
		return uuid.NullUUID{}, errors.New("not in the brokers' metadata")
	case d.Err != nil:
		return uuid.NullUUID{}, d.Err
	case d.ID == (kadm.TopicID{}):
		return uuid.NullUUID{}, errNoTopicIDs
	}
	return uuid.NullUUID{UUID: uuid.UUID(d.ID), Valid: true}, nil
}

// watchBrokers asks the brokers every few seconds whether they answer and
// publishes the answer through Ready, logging each change; when they
// answer, it checks the consumed topics too (checkTopics).
func (c *Consumer) watchBrokers(ctx context.Context, cl *kgo.Client) {
	const every = 3 * time.Second
	var last error = ErrNotStarted
	topics := map[string]topicState{}
	for {
		pctx, cancel := context.WithTimeout(ctx, every)
		err := cl.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = fmt.Errorf("kafka brokers %v do not answer: %w", c.cfg.Brokers, err)
		}
		c.ready.Store(&err)
		switch {
		case err != nil && (last == nil || errors.Is(last, ErrNotStarted)):
			c.log.Warn("waiting for the kafka brokers", "brokers", c.cfg.Brokers, "err", err)
		case err == nil && last != nil:
			c.log.Info("kafka brokers answer", "brokers", c.cfg.Brokers)
		}
		last = err
		if err == nil {
			if c.checkTopics(ctx, cl, topics) {
				cl.ForceMetadataRefresh()
			}
			c.refreshPaused(ctx)
			c.settleOutOfRange(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// refreshPaused reads again the log bounds of the partitions whose
// fetching is paused, which no fetch brings: those left paused because
// their stored offset was out of range (PauseOnOutOfRange), whose lag
// (Lag) is their whole log as it grows — a recreated topic found empty
// gets records —, and those paused while their worker's queue is full,
// whose lag grows with their log's end while the worker works through the
// queue (a slow database).
func (c *Consumer) refreshPaused(ctx context.Context) {
	paused := map[string]map[int32]sink.Lease{}
	c.mu.Lock()
	for k, p := range c.parts {
		if p.w == nil && p.retakeAt.IsZero() || p.w != nil && p.w.queueFull() {
			if paused[k.topic] == nil {
				paused[k.topic] = map[int32]sink.Lease{}
			}
			paused[k.topic][k.partition] = sink.Lease{NextOffset: -1}
		}
	}
	c.mu.Unlock()
	for topic, ps := range paused {
		bounds := c.logBounds(ctx, topic, ps)
		c.mu.Lock()
		for p, b := range bounds {
			switch part := c.parts[tp{topic, p}]; {
			case part == nil:
			case part.w == nil && part.retakeAt.IsZero():
				part.hw, part.start = b.stable, b.start
			case part.w != nil:
				part.hw = max(part.hw, b.stable) // a fetch may have brought a later one meanwhile
			}
		}
		c.mu.Unlock()
	}
}

// lookFresh is the oldest metadata a look at the topics (checkTopics)
// takes from the client's cache: less than the looks' interval, so that
// each look asks the brokers (the client's own min age, 5 s by default,
// gave two looks 3 s apart one answer, and a topic recreated between them
// was said missing).
const lookFresh = time.Second

// topicState is what checkTopics knows of one consumed topic.
type topicState struct {
	said       string   // what was said last: "" (it exists), "missing", or the brokers' error
	seen       bool     // said's value stands for an earlier look
	missing    int      // looks in a row that found it missing
	partitions int      // its partition count at the last look that found it; 0: none yet
	id         [16]byte // its topic id then
}

// checkTopics asks the brokers about the consumed topics and logs each
// change of what they say, once: a topic they do not have (a typo, or one
// not created yet — the member consumes it once it exists, and says so),
// or whose metadata they refuse (an ACL). state holds, per topic, what
// was said last. A topic is said missing once two looks in a row (3 s
// apart) find it so: just after a topic is deleted and created again, one
// look can miss it while it is consumed already.
//
// A topic the brokers give another id than the one the member took its
// partitions under (topicIDs) was deleted and recreated: checkTopics notes
// it (noteRecreated) for the poll loop to re-add. The client says so too,
// but only once its own metadata is refreshed, and a member whose
// partitions are all paused (PauseOnOutOfRange) fetches nothing that
// would refresh it before MetadataMaxAge (5 minutes by default).
//
// refresh reports that a consumed topic has another partition count or
// id than the last look found: partitions added, or the topic recreated.
// The caller has the client read the brokers' metadata again then: under
// the classic protocol the group's leader rebalances when its client's
// metadata shows new partitions, which the client's own refresh
// (MetadataMaxAge, 5 minutes by default) left unread and unwatched that
// long — also when the client learned the recreated topic before
// partitions were added to it, and this look sees both at once.
//
// The metadata is asked for as is (at most lookFresh old), not through
// kadm's ListTopics, which fails as a whole when one topic is refused: the
// refused topic, and any missing one beside it, would never be said.
func (c *Consumer) checkTopics(ctx context.Context, cl *kgo.Client, state map[string]topicState) (refresh bool) {
	req := kmsg.NewPtrMetadataRequest()
	for _, topic := range c.cfg.Topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
	}
	tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	resp, err := cl.RequestCachedMetadata(tctx, req, lookFresh)
	cancel()
	if err != nil {
		return false // asked again next time
	}
	errs := make(map[string]error, len(resp.Topics))
	counts := make(map[string]int, len(resp.Topics))
	ids := make(map[string][16]byte, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		errs[*t.Topic] = kerr.ErrorForCode(t.ErrorCode)
		counts[*t.Topic], ids[*t.Topic] = len(t.Partitions), t.TopicID
		if t.ErrorCode == 0 && t.TopicID != [16]byte{} {
			// Under mu: readd forgets the held id under mu before it
			// forgets the note, so a note taken here is never left for a
			// topic already re-added.
			c.mu.Lock()
			if held := c.topicIDs[*t.Topic]; held.Valid && held.UUID != uuid.UUID(t.TopicID) {
				c.log.Info("the brokers give the consumed topic a new id: it was deleted and recreated", "topic", *t.Topic,
					"topic_id", uuid.UUID(t.TopicID), "held_topic_id", held.UUID)
				c.noteRecreated(*t.Topic)
			}
			c.mu.Unlock()
		}
	}
	for _, topic := range c.cfg.Topics {
		now := ""
		if terr, ok := errs[topic]; !ok || errors.Is(terr, kerr.UnknownTopicOrPartition) {
			now = "missing"
		} else if terr != nil {
			now = terr.Error()
		}
		st := state[topic]
		if now == "" {
			n, id := counts[topic], ids[topic]
			if st.partitions > 0 && (n != st.partitions || id != st.id) {
				refresh = true
				if n > st.partitions && id == st.id {
					c.log.Info("partitions added to the consumed topic: the member's client reads the brokers' metadata again, for the group to assign them",
						"topic", topic, "partitions", n, "before", st.partitions)
				}
			}
			st.partitions, st.id = n, id
		}
		if now != "missing" {
			st.missing = 0
		} else if st.missing++; st.missing < 2 && st.said != "missing" {
			state[topic] = st // once: not said yet
			continue
		}
		was, seen := st.said, st.seen
		st.said, st.seen = now, true
		state[topic] = st
		switch {
		case now == was:
		case now == "missing":
			c.log.Warn("consumed topic does not exist; the member waits for it to be created", "topic", topic, "brokers", c.cfg.Brokers)
		case now != "":
			c.log.Warn("the brokers refuse the consumed topic's metadata", "topic", topic, "err", now)
		case seen:
			c.log.Info("consumed topic exists now", "topic", topic)
		}
	}
	return refresh
}
