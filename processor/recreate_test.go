package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// A consumed topic deleted and created again under the same name while a
// group's members run is consumed again by the same members, without a
// restart: each takes the new topic's partitions from their start (its
// offsets start again from 0, below what Postgres and Kafka stored for
// the old one), more partitions than before included, and applies every
// record of the new topic once. Whether the members saw the topic
// missing before it came back or not, or even purged it while it was
// missing, none stops, and the offsets stored carry the new topic's id.
// A poison record of the new topic at the offset of one of the old
// topic's is a dead letter of its own. (franz-go keeps a topic's first id and fails
// every fetch of the new one with UNKNOWN_TOPIC_ID until the topic is
// purged from the client and added again: the members consumed nothing
// more until restarted.)
func TestRecreatedTopicIsConsumed(t *testing.T) {
	for _, tc := range []struct {
		name        string
		partitions  int32 // the new topic's; the old one has 2
		seenMissing bool  // the members said the topic missing before it came back
		readded     bool  // and purged it from their client
	}{
		{name: "at-once", partitions: 3},
		{name: "fewer-partitions", partitions: 1},
		{name: "after-missing", partitions: 3, seenMissing: true},
		{name: "readded-while-missing", partitions: 3, seenMissing: true, readded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachPlainBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 2)
				logs := &logRecorder{}
				var ms []*member
				for _, name := range []string{"recreate-a", "recreate-b"} {
					cfg := e.config(name)
					if cfg.Logger != nil { // ONCEFLOW_TEST_LOG
						cfg.Logger = slog.New(slog.NewMultiHandler(logs, cfg.Logger.Handler()))
					} else {
						cfg.Logger = slog.New(logs)
					}
					ms = append(ms, e.start(cfg, e.writer(100)))
				}
				before, err := orders.Generate(60, 0, 11)
				if err != nil {
					t.Fatal(err)
				}
				e.producePartitions(before.Messages, 2, true)
				e.waitProcessed(60, 60*time.Second)
				oldID := e.topicID()

				e.deleteTopic(e.topic)
				if tc.seenMissing {
					waitLogged(t, logs, slog.LevelWarn, "does not exist", 30*time.Second)
				}
				if tc.readded {
					waitLogged(t, logs, slog.LevelWarn, "consumed topic deleted", 60*time.Second)
				}
				e.createTopicAgain(e.topic, tc.partitions)
				newID := e.topicID()
				if newID == oldID {
					t.Fatalf("the recreated topic has the old topic's id %v", oldID)
				}

				after, err := orders.Generate(60, 0, 12)
				if err != nil {
					t.Fatal(err)
				}
				e.producePartitions(after.Messages, tc.partitions, true)
				e.waitProcessed(120, 90*time.Second)
				want := maps.Clone(before.Unique)
				maps.Copy(want, after.Unique)
				e.checkExactlyOnce(want)

				// Each partition of the new topic stored its log end under
				// the new id: it was read from its start.
				end := fmt.Sprint(1 + 60/tc.partitions)
				deadline := time.Now().Add(30 * time.Second)
				for {
					n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_offsets
WHERE consumer_group = '`+e.group+`' AND topic = '`+e.topic+`' AND next_offset = `+end+` AND topic_id = '`+newID.String()+`'`)
					if n == int64(tc.partitions) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%d partitions of the new topic stored offset %s under its id, want %d", n, end, tc.partitions)
					}
					time.Sleep(100 * time.Millisecond)
				}
				// The poison records at partition 0, offset 0: one dead letter
				// per topic id.
				for _, id := range []uuid.UUID{oldID, newID} {
					if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters
WHERE topic = '`+e.topic+`' AND partition = 0 AND "offset" = 0 AND topic_id = '`+id.String()+`'`); n != 1 {
						t.Errorf("dead letters at partition 0, offset 0 under topic id %v = %d, want 1", id, n)
					}
				}
				for _, m := range ms {
					m.stop(t)
				}
			})
		})
	}
}

// producePartitions publishes msgs round-robin over the topic's first n
// partitions, synchronously; with poison, each partition's first record
// is one that cannot be decoded (its value is not JSON).
func (e *env) producePartitions(msgs []orders.Message, n int32, poison bool) {
	e.t.Helper()
	cl := e.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for p := range n {
		if poison {
			r := wire.NewRecord(e.topic, uuid.New(), []byte("{not json"))
			r.Partition = p
			recs = append(recs, r)
		}
	}
	for i, m := range msgs {
		r := wire.NewRecord(e.topic, m.ID, m.Value)
		r.Partition = int32(i) % n
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// topicID is the consumed topic's Kafka id now, once every broker asked
// knows it (a topic just created may be unknown to some for a moment).
func (e *env) topicID() uuid.UUID {
	e.t.Helper()
	adm := kadm.NewClient(e.client())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		details, err := adm.ListTopics(ctx, e.topic)
		if err == nil {
			err = details.Error()
		}
		if err == nil {
			return uuid.UUID(details[e.topic].ID)
		}
		if ctx.Err() != nil {
			e.t.Fatalf("topic id of %s: %v", e.topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deleteTopic deletes topic and waits until the brokers no longer list
// it.
func (e *env) deleteTopic(topic string) {
	e.t.Helper()
	adm := kadm.NewClient(e.client())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := adm.DeleteTopics(ctx, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		e.t.Fatalf("delete topic %s: %v", topic, err)
	}
	for {
		details, err := adm.ListTopics(ctx, topic)
		if err == nil && !details.Has(topic) {
			return
		}
		if ctx.Err() != nil {
			e.t.Fatalf("topic %s still listed 60s after its deletion", topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createTopicAgain creates topic with partitions, retrying while the
// brokers still finish deleting it.
func (e *env) createTopicAgain(topic string, partitions int32) {
	e.t.Helper()
	adm := kadm.NewClient(e.client())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		resp, err := adm.CreateTopic(ctx, partitions, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err == nil {
			return
		}
		if ctx.Err() != nil || !(errors.Is(err, kerr.TopicAlreadyExists) || kerr.IsRetriable(err)) {
			e.t.Fatalf("create topic %s again: %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A dead-letter topic deleted and created again while a member runs gets
// the dead letters written after: the member's client, which franz-go
// keeps on the old topic id (every produce to the new topic failed with
// UNKNOWN_TOPIC_ID), learns the new one, and no row stays unpublished.
func TestRecreatedDeadLetterTopicIsPublished(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		cfg := e.config("recreate-dlq")
		cfg.ProduceTimeout, cfg.CallTimeout = 2*time.Second, 2*time.Second // a failed copy is leased again 6s later
		e.start(cfg, e.writer(0))
		published := func(n int64) {
			t.Helper()
			deadline := time.Now().Add(60 * time.Second)
			for {
				got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE published_at IS NOT NULL`)
				if got >= n {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d dead letters published within 60s, want %d", got, n)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		e.produce(wire.NewRecord(e.topic, uuid.New(), []byte("{not json")))
		published(1)

		e.deleteTopic(e.dlq)
		e.createTopicAgain(e.dlq, 1)
		second := uuid.New()
		e.produce(wire.NewRecord(e.topic, second, []byte("{not json either")))
		published(2)
		got := e.consumeAll(e.dlq, 1, 30*time.Second)
		if len(got) != 1 || headers(got[0])["event_id"] != second.String() {
			t.Errorf("the recreated dead-letter topic holds %d records (%v), want the second dead letter", len(got), got)
		}
	})
}
