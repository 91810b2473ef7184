package replay_test

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/internal/replay"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// A partition whose stored offset is not an offset of its log today is
// left paused by members under kafka.offset_out_of_range: pause. A rewind
// moves it to its log start with the topic's id today, so that the next
// member consumes it: a recreated topic's records once each (read for the
// first time: no sink_replays row), and after records deleted below the
// stored offset, what the log holds, while a partition in range is not
// moved by a reset of the offsets out of range.
func TestResetOutOfRange(t *testing.T) {
	pause := func(c *processor.Config) { c.OffsetOutOfRange = processor.PauseOnOutOfRange }
	eachBroker(t, func(t *testing.T, seeds []string) {
		t.Run("recreated", func(t *testing.T) {
			e := newEnv(t, seeds)
			s := stream(t, 40)
			e.produce(s.Messages, time.Now())
			e.runUntil(int64(len(s.Messages)))
			e.recreate(2)
			s2 := stream(t, 30)
			e.produce(s2.Messages, time.Now())
			id := e.topicID()

			r := e.replayer(0)
			req := replay.Request{Target: replay.Target{Start: true}}
			plan, err := r.Plan(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range plan.Partitions {
				if !p.Reset || p.OutOfRange == "" || p.Target != 0 || p.Until != 0 || p.TopicID.UUID != id {
					t.Errorf("%s: reset %v (%q), target %d, until %d, topic id %v; want a reset to 0, nothing read again, id %s",
						p.TopicPartition, p.Reset, p.OutOfRange, p.Target, p.Until, p.TopicID, id)
				}
			}
			if err := r.Rewind(t.Context(), plan, req); err != nil {
				t.Fatal(err)
			}
			if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1 AND topic_id = $2 AND next_offset = 0`, e.group, id); n != 2 {
				t.Errorf("%d partitions stored at 0 under topic id %s after the rewind, want 2", n, id)
			}
			if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_replays`); n != 0 {
				t.Errorf("%d sink_replays rows: a recreated topic's records are not read again", n)
			}
			e.consume(int64(len(s2.Messages)), pause)
			want := maps.Clone(s.Unique)
			maps.Copy(want, s2.Unique)
			e.check(want)
		})
		t.Run("recreated with fewer partitions", func(t *testing.T) {
			e := newEnv(t, seeds)
			s := stream(t, 40)
			e.produce(s.Messages, time.Now())
			e.runUntil(int64(len(s.Messages)))
			e.recreate(1)
			e.topicID() // the brokers know it
			r := e.replayer(0)
			req := replay.Request{Target: replay.Target{OutOfRange: true}}
			plan, err := r.Plan(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Partitions) != 1 || !plan.Partitions[0].Reset || len(plan.Gone) != 1 || plan.Gone[0].Partition != 1 {
				t.Fatalf("plan: partitions %+v, gone %+v; want partition 0 reset and partition 1 gone", plan.Partitions, plan.Gone)
			}
			if err := r.Rewind(t.Context(), plan, req); err != nil {
				t.Fatal(err)
			}
			if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1 AND partition = 1 AND next_offset IS NULL AND topic_id IS NULL`, e.group); n != 1 {
				t.Errorf("partition 1's stored offset not cleared (%d rows)", n)
			}
			// The partition added again starts from its log start.
			resp, err := kadm.NewClient(e.client()).CreatePartitions(t.Context(), 1, e.topic)
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				t.Fatalf("add a partition: %v", err)
			}
			more := stream(t, 20)
			e.produce(more.Messages, time.Now())
			e.consume(int64(len(more.Messages)), func(c *processor.Config) { c.OffsetOutOfRange = processor.PauseOnOutOfRange })
			want := maps.Clone(s.Unique)
			maps.Copy(want, more.Unique)
			e.check(want)
		})
		t.Run("an offset only Kafka has, below the log start", func(t *testing.T) {
			e := newEnv(t, seeds)
			e.produceOn(0, stream(t, 30).Messages)
			e.deleteBelow(0, 20)
			var o kadm.Offsets
			o.Add(kadm.Offset{Topic: e.topic, Partition: 0, At: 5, LeaderEpoch: -1})
			resp, err := kadm.NewClient(e.client()).CommitOffsets(t.Context(), e.group, o)
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				t.Fatal(err)
			}
			plan, err := e.replayer(0).Plan(t.Context(), replay.Request{Target: replay.Target{Start: true}})
			if err != nil {
				t.Fatal(err)
			}
			// What the dry run shows is what the rewind does: nothing.
			if p0 := plan.Partitions[0]; p0.Current != 5 || p0.Target != 5 || p0.Moves() {
				t.Errorf("partition 0 (Kafka's offset 5, the log from 20): %d -> %d, moves %v; want it not moved", p0.Current, p0.Target, p0.Moves())
			}
		})
		t.Run("below the log start", func(t *testing.T) {
			e := newEnv(t, seeds)
			s := stream(t, 40)
			e.produce(s.Messages, time.Now())
			total := int64(len(s.Messages))
			e.runUntil(total)
			// Records after the stored offset of partition 0 are deleted
			// before the group reads them: below the new log start.
			ends := e.produceOn(0, stream(t, 10).Messages)
			e.deleteBelow(0, ends)
			s3 := stream(t, 20)
			e.produceOn(1, s3.Messages)
			stored := sinktest.Count(t, e.pool, `SELECT next_offset FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1 AND partition = 1`, e.group)

			r := e.replayer(0)
			req := replay.Request{Target: replay.Target{OutOfRange: true}}
			plan, err := r.Plan(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			p0, p1 := plan.Partitions[0], plan.Partitions[1]
			if !p0.Reset || p0.Target != ends || p0.Until != ends || !p0.Moves() || p0.Replays() {
				t.Errorf("partition 0: reset %v (%q), %d -> %d until %d; want a reset to the log start %d, nothing read again", p0.Reset, p0.OutOfRange, p0.Current, p0.Target, p0.Until, ends)
			}
			if p1.Reset || p1.OutOfRange != "" || p1.Moves() {
				t.Errorf("partition 1 (in range): reset %v (%q), %d -> %d; want it not moved", p1.Reset, p1.OutOfRange, p1.Current, p1.Target)
			}
			if err := r.Rewind(t.Context(), plan, req); err != nil {
				t.Fatal(err)
			}
			// Partition 0 resumes at its log start (what is produced
			// now), partition 1 where it was.
			s4 := stream(t, 15)
			e.produceOn(0, s4.Messages)
			e.consume(ends+int64(len(s4.Messages))+stored+int64(len(s3.Messages)), pause)
			want := maps.Clone(s.Unique)
			maps.Copy(want, s3.Unique)
			maps.Copy(want, s4.Unique)
			e.check(want)
			if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_replays`); n != 0 {
				t.Errorf("%d sink_replays rows: a reset past deleted records reads nothing again", n)
			}
		})
	})
}

// consume runs a member with edit until the group's stored offsets sum to
// n, and stops it.
func (e *env) consume(n int64, edit func(*processor.Config)) {
	e.t.Helper()
	m := e.startAs("member-"+uuid.NewString()[:8], edit)
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	if err := members.WaitCommitted(ctx, e.pool, e.schema, e.group, n, 50*time.Millisecond); err != nil {
		e.t.Fatal(err)
	}
	if err := m.Leave(); err != nil {
		e.t.Fatal(err)
	}
}

// recreate deletes the test's topic and creates it again, with n
// partitions (the brokers may take a moment to finish the deletion).
func (e *env) recreate(n int32) {
	e.t.Helper()
	adm := kadm.NewClient(e.client())
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	if _, err := adm.DeleteTopics(ctx, e.topic); err != nil {
		e.t.Fatalf("delete topic %s: %v", e.topic, err)
	}
	for {
		resp, err := adm.CreateTopic(ctx, n, 1, nil, e.topic)
		if err == nil {
			err = resp.Err
		}
		if err == nil {
			return
		}
		if !errors.Is(err, kerr.TopicAlreadyExists) || ctx.Err() != nil {
			e.t.Fatalf("create topic %s again: %v", e.topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// topicID is the test topic's Kafka id.
func (e *env) topicID() uuid.UUID {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	for {
		md, err := kadm.NewClient(e.client()).Metadata(ctx, e.topic)
		if err != nil {
			e.t.Fatal(err)
		}
		if d, ok := md.Topics[e.topic]; ok && d.Err == nil && d.ID != (kadm.TopicID{}) {
			return uuid.UUID(d.ID)
		}
		if ctx.Err() != nil {
			e.t.Fatalf("no topic id for %s", e.topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// produceOn publishes msgs to partition p and returns its end offset after.
func (e *env) produceOn(p int32, msgs []orders.Message) int64 {
	e.t.Helper()
	cl := e.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
		recs[i].Partition = p
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	res := cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
	return res[len(res)-1].Record.Offset + 1
}

// deleteBelow deletes partition p's records below offset.
func (e *env) deleteBelow(p int32, offset int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	os := kadm.Offsets{}
	os.Add(kadm.Offset{Topic: e.topic, Partition: p, At: offset, LeaderEpoch: -1})
	resp, err := kadm.NewClient(e.client()).DeleteRecords(ctx, os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		e.t.Fatalf("delete records of %s/%d below %d: %v", e.topic, p, offset, err)
	}
}
