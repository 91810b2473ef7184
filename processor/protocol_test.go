package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
)

// protocolConfig is the tests' consumer config under protocol, static as
// instanceID when it is set.
func (e *env) protocolConfig(name string, protocol processor.GroupProtocol, instanceID string) processor.Config {
	cfg := e.config(name)
	cfg.GroupProtocol, cfg.InstanceID = protocol, instanceID
	return cfg
}

// groupType asks the brokers which protocol the test's group runs.
func (e *env) groupType() string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	groups, err := kadm.NewClient(e.client()).ListGroups(ctx)
	if err != nil {
		e.t.Fatalf("list groups: %v", err)
	}
	return groups[e.group].GroupType
}

// waitWorkers waits until the members run want partition workers in all,
// each member at least one.
func waitWorkers(t *testing.T, want int64, timeout time.Duration, ms ...*member) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var n int64
		each := true
		for _, m := range ms {
			w := m.c.Stats().Workers
			n += w
			each = each && w > 0
		}
		if n == want && each {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the members run %d partition workers (each at least one: %v) after %v, want %d", n, each, timeout, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Under the consumer protocol (KIP-848) a group whose members join, leave
// and are killed consumes a stream with redeliveries exactly once, and no
// batch is ever fenced: the broker assigns a partition only once its
// previous owner released it (its revoke drained and committed), or once
// a killed owner's session expired.
func TestConsumerProtocolChurn(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 6)
		stream, err := orders.Generate(6000, 0.3, 31)
		if err != nil {
			t.Fatal(err)
		}
		third := len(stream.Messages) / 3
		consumer := processor.ConsumerProtocol
		w := e.writer(10000)
		m1 := e.start(e.protocolConfig("m1", consumer, ""), w)
		e.produceMessages(stream.Messages[:third])
		m2 := e.start(e.protocolConfig("m2", consumer, ""), w)
		e.waitProcessed(800, 90*time.Second)
		if got := e.groupType(); got != string(processor.ConsumerProtocol) {
			t.Fatalf("the group runs the %q protocol, want consumer", got)
		}
		m1.stop(t) // leaves
		// m3 has no cache: Postgres alone dedups.
		m3 := e.start(e.protocolConfig("m3", consumer, ""), e.writer(0))
		e.produceMessages(stream.Messages[third : 2*third])
		e.waitProcessed(2500, 90*time.Second)
		m2.c.Kill() // a SIGKILL: no leave, its partitions wait for its session to expire
		m2.stop(t)
		m4 := e.start(e.protocolConfig("m4", consumer, ""), e.writer(1000))
		e.produceMessages(stream.Messages[2*third:])
		e.waitProcessed(int64(len(stream.Unique)), 150*time.Second)
		m3.stop(t)
		m4.stop(t)
		e.checkExactlyOnce(stream.Unique)

		var s processor.Stats
		for _, m := range []*member{m1, m2, m3, m4} {
			s = s.Plus(m.c.Stats())
		}
		if s.Assigned <= 6 {
			t.Errorf("partitions assigned %d times over the test, want more than 6 (the group reassigned them)", s.Assigned)
		}
		if s.Fenced != 0 {
			t.Errorf("%d batches were fenced, want 0: a partition was assigned before its previous owner released it", s.Fenced)
		}
		if s.Workers != 0 {
			t.Errorf("%d workers still run after every member stopped", s.Workers)
		}
	})
}

// A static member (kafka.instance_id) that stops and is restarted with
// the same instance id within the session timeout gets its partitions
// back, and no other member is assigned them meanwhile, under both
// protocols, whether it was drained (under the consumer protocol it left
// for now, epoch -2) or killed (no leave). Under the consumer protocol
// the broker refuses a new member with a static member's instance id
// until that member left (UNRELEASED_INSTANCE_ID): the restart first
// sends the leave its killed predecessor never sent, and says so. Every
// event is applied once in every case.
func TestStaticMemberRestartKeepsPartitions(t *testing.T) {
	for _, tc := range []struct {
		protocol processor.GroupProtocol
		kill     bool
		kept     bool // the restart gets the partitions back, no one else is assigned them
	}{
		{processor.ClassicProtocol, true, true},
		{processor.ClassicProtocol, false, true},
		{processor.ConsumerProtocol, true, true},
		{processor.ConsumerProtocol, false, true},
	} {
		stop := map[bool]string{true: "killed", false: "drained"}[tc.kill]
		t.Run(string(tc.protocol)+"/"+stop, func(t *testing.T) {
			eachPlainBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 4)
				stream, err := orders.Generate(4000, 0.2, 32)
				if err != nil {
					t.Fatal(err)
				}
				half := len(stream.Messages) / 2
				config := func(name string) processor.Config {
					cfg := e.protocolConfig(name, tc.protocol, name)
					// Room for the restart: the session outlives it.
					cfg.SessionTimeout, cfg.RebalanceTimeout = 20*time.Second, 30*time.Second
					return cfg
				}
				a := e.start(config("a"), e.writer(1000))
				bm := e.start(config("b"), e.writer(1000))
				e.produceMessages(stream.Messages[:half])
				waitWorkers(t, 4, 90*time.Second, a, bm)
				e.waitProcessed(500, 90*time.Second)
				heldA, assignedB := a.c.Stats().Workers, bm.c.Stats().Assigned

				if tc.kill {
					a.c.Kill() // no leave
				}
				a.stop(t)
				logs := &logRecorder{}
				cfg := config("a")
				cfg.Logger = slog.New(logs)
				a2 := e.start(cfg, e.writer(1000))
				e.produceMessages(stream.Messages[half:])
				e.waitProcessed(int64(len(stream.Unique)), 120*time.Second)
				waitWorkers(t, 4, 30*time.Second, a2, bm)
				a2.stop(t)
				bm.stop(t)
				e.checkExactlyOnce(stream.Unique)

				t.Logf("the stopped member held %d partitions, the other was assigned %d; the restart got %d, the other %d more",
					heldA, assignedB, a2.c.Stats().Assigned, bm.c.Stats().Assigned-assignedB)
				if tc.protocol == processor.ConsumerProtocol && tc.kill {
					if _, ok := logs.find(slog.LevelWarn, "replaced the group's member with this member's instance id"); !ok {
						t.Error("the restart did not say that it replaced the killed member still holding its instance id")
					}
				}
				if !tc.kept {
					return
				}
				if got := bm.c.Stats().Assigned; got != assignedB {
					t.Errorf("the other member was assigned %d partitions over the test, want its first %d: the stopped member's partitions moved", got, assignedB)
				}
				if got := a2.c.Stats().Assigned; got != heldA {
					t.Errorf("the restarted member was assigned %d partitions, want the %d it held", got, heldA)
				}
			})
		})
	}
}

// A Kafka offset commit refused with STALE_MEMBER_EPOCH or
// FENCED_MEMBER_EPOCH (brokers before 4.3 refuse commits sent as the
// member's epoch moves on) is logged once per partition and epoch, at
// info, and changes nothing: every event is applied once, and the next
// member starts from the offsets stored in Postgres, reading nothing
// again although Kafka has no committed offset. kfake only: the commits
// are refused with a control function.
func TestEpochRefusedCommitIsLoggedOnce(t *testing.T) {
	for _, refusal := range []*kerr.Error{kerr.StaleMemberEpoch, kerr.FencedMemberEpoch} {
		t.Run(refusal.Message, func(t *testing.T) {
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond), kfake848)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			e := newEnv(t, broker{name: "kfake", start: func(t *testing.T, topic string, partitions int32, extra ...string) []string {
				createTopics(t, cluster.ListenAddrs(), partitions, append([]string{topic}, extra...)...)
				return cluster.ListenAddrs()
			}}, 3)
			var refusing atomic.Bool
			var refused atomic.Int64
			refusing.Store(true)
			cluster.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
				cluster.KeepControl()
				if !refusing.Load() {
					return nil, nil, false
				}
				creq := req.(*kmsg.OffsetCommitRequest)
				resp := creq.ResponseKind().(*kmsg.OffsetCommitResponse)
				resp.Version = creq.Version
				for _, rt := range creq.Topics {
					st := kmsg.NewOffsetCommitResponseTopic()
					st.Topic, st.TopicID = rt.Topic, rt.TopicID
					for _, rp := range rt.Partitions {
						sp := kmsg.NewOffsetCommitResponseTopicPartition()
						sp.Partition, sp.ErrorCode = rp.Partition, refusal.Code
						st.Partitions = append(st.Partitions, sp)
						refused.Add(1)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})

			stream, err := orders.Generate(3000, 0.2, 33)
			if err != nil {
				t.Fatal(err)
			}
			logs := &logRecorder{}
			cfg := e.protocolConfig("m1", processor.ConsumerProtocol, "")
			cfg.Logger = slog.New(logs)
			m1 := e.start(cfg, e.writer(1000))
			// In small steps, so that several background commits come
			// between them.
			step := len(stream.Messages) / 5
			for i := 0; i < len(stream.Messages); i += step {
				e.produceMessages(stream.Messages[i:min(i+step, len(stream.Messages))])
				time.Sleep(300 * time.Millisecond)
			}
			e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
			m1.stop(t) // its shutdown commit is refused too
			e.checkExactlyOnce(stream.Unique)

			const said = "kafka refused an offset commit for this member's epoch"
			lines := map[string]int{}
			logs.mu.Lock()
			for i, r := range logs.recs {
				if strings.HasPrefix(r["msg"], said) {
					if logs.lvls[i] != slog.LevelInfo {
						t.Errorf("refusal logged at %v, want info", logs.lvls[i])
					}
					lines[fmt.Sprint(r["partition"], "@", r["member_epoch"])]++
				}
			}
			logs.mu.Unlock()
			n := 0
			for k, c := range lines {
				n += c
				if c != 1 {
					t.Errorf("refusal of partition@epoch %s logged %d times, want once", k, c)
				}
			}
			t.Logf("%d partition commits refused, %d log lines (%v)", refused.Load(), n, lines)
			if n == 0 || refused.Load() <= int64(n) {
				t.Errorf("%d refusals logged of %d refused partition commits; want at least one, and fewer lines than refusals", n, refused.Load())
			}
			if c := logs.count(slog.LevelWarn, "commit offset"); c != 0 {
				t.Errorf("%d warnings about commits, want none: an epoch refusal is not a problem", c)
			}

			// Kafka has no committed offset; Postgres has them all. The
			// next member reads only what comes after.
			refusing.Store(false)
			m2 := e.start(e.protocolConfig("m2", processor.ConsumerProtocol, ""), e.writer(0))
			waitWorkers(t, 3, 60*time.Second, m2)
			more, err := orders.Generate(300, 0, 34)
			if err != nil {
				t.Fatal(err)
			}
			e.produceMessages(more.Messages)
			e.waitProcessed(int64(len(stream.Unique)+len(more.Unique)), 60*time.Second)
			m2.stop(t)
			s := m2.c.Stats()
			if s.RecordsConsumed != int64(len(more.Messages)) || s.SkippedPostgres != 0 {
				t.Errorf("the next member consumed %d records (skipped %d in postgres), want only the %d new ones",
					s.RecordsConsumed, s.SkippedPostgres, len(more.Messages))
			}
		})
	}
}

// Under the consumer protocol, a member whose heartbeat is answered
// FENCED_MEMBER_EPOCH loses its partitions: its workers stop as on a lost
// partition under the classic protocol (aborted, nothing committed), it
// rejoins, and every event is still applied once. kfake only: the fence is
// a control function's answer.
func TestConsumerProtocolLostStopsWorkers(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond), kfake848)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	e := newEnv(t, broker{name: "kfake", start: func(t *testing.T, topic string, partitions int32, extra ...string) []string {
		createTopics(t, cluster.ListenAddrs(), partitions, append([]string{topic}, extra...)...)
		return cluster.ListenAddrs()
	}}, 3)
	stream, err := orders.Generate(3000, 0.2, 35)
	if err != nil {
		t.Fatal(err)
	}
	var fence atomic.Bool
	var once sync.Once
	fenced := make(chan struct{})
	cluster.ControlKey(kmsg.ConsumerGroupHeartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		hb := req.(*kmsg.ConsumerGroupHeartbeatRequest)
		if !fence.Load() || hb.MemberEpoch <= 0 {
			return nil, nil, false
		}
		fence.Store(false)
		resp := hb.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.Version = hb.Version
		resp.ErrorCode = kerr.FencedMemberEpoch.Code
		once.Do(func() { close(fenced) })
		return resp, nil, true
	})
	m := e.start(e.protocolConfig("m1", processor.ConsumerProtocol, ""), e.writer(1000))
	e.produceMessages(stream.Messages[:len(stream.Messages)/2])
	waitWorkers(t, 3, 60*time.Second, m)
	e.waitProcessed(300, 60*time.Second)
	fence.Store(true)
	select {
	case <-fenced:
	case <-time.After(30 * time.Second):
		t.Fatal("no heartbeat was fenced")
	}
	deadline := time.Now().Add(30 * time.Second)
	for m.c.Stats().Lost < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := m.c.Stats().Lost; got != 3 {
		t.Fatalf("%d partitions lost after the fence, want 3", got)
	}
	e.produceMessages(stream.Messages[len(stream.Messages)/2:])
	e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
	waitWorkers(t, 3, 30*time.Second, m) // taken again after the rejoin
	m.stop(t)
	e.checkExactlyOnce(stream.Unique)
	if s := m.c.Stats(); s.Assigned != 6 || s.Fenced != 0 {
		t.Errorf("assigned %d, fenced batches %d; want 6 (3, lost, 3 again) and 0", s.Assigned, s.Fenced)
	}
}

// Two running members with one instance id under the classic protocol:
// the one that joins last takes the partitions and the other stops, its
// Run returning ErrInstanceFenced, instead of rejoining and fencing the
// newcomer in turn. Every event is applied once.
func TestDuplicateInstanceIDStopsTheFencedMember(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		stream, err := orders.Generate(2000, 0, 36)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages[:len(stream.Messages)/2])
		logs := &logRecorder{}
		cfg := e.protocolConfig("first", processor.ClassicProtocol, "same")
		cfg.Logger = slog.New(logs)
		first := e.start(cfg, e.writer(1000))
		waitWorkers(t, 2, 60*time.Second, first)
		second := e.start(e.protocolConfig("second", processor.ClassicProtocol, "same"), e.writer(1000))
		var runErr error
		select {
		case runErr = <-first.done:
			first.once.Do(func() {}) // collected here
		case <-time.After(60 * time.Second):
			t.Fatal("the fenced member did not stop")
		}
		if !errors.Is(runErr, processor.ErrInstanceFenced) {
			t.Fatalf("the fenced member's Run returned %v, want ErrInstanceFenced", runErr)
		}
		if err := first.c.Ready(); !errors.Is(err, processor.ErrInstanceFenced) {
			t.Errorf("the fenced member's Ready() = %v, want ErrInstanceFenced", err)
		}
		if _, ok := logs.find(slog.LevelError, "another member joined with this member's instance id"); !ok {
			t.Error("the fenced member logged no error")
		}
		e.produceMessages(stream.Messages[len(stream.Messages)/2:])
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		if got := second.c.Stats().Workers; got != 2 {
			t.Errorf("the member that joined last runs %d workers, want 2", got)
		}
		second.stop(t)
		e.checkExactlyOnce(stream.Unique)
	})
}

// Two running members with one instance id under the consumer protocol:
// the one that starts last replaces the other, which loses its partitions
// (its workers stop) and, refused when it rejoins, says that another live
// member holds its instance id, and reads not ready (Ready names the
// reason) for as long as it is refused. Its stop has nothing to leave: it
// says so at info, with no warning. Every event is applied once.
func TestDuplicateInstanceIDUnderConsumerProtocol(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		stream, err := orders.Generate(2000, 0, 37)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages[:len(stream.Messages)/2])
		logs := &logRecorder{}
		cfg := e.protocolConfig("first", processor.ConsumerProtocol, "same")
		cfg.Logger = slog.New(logs)
		first := e.start(cfg, e.writer(1000))
		waitWorkers(t, 2, 60*time.Second, first)
		second := e.start(e.protocolConfig("second", processor.ConsumerProtocol, "same"), e.writer(1000))
		waitWorkers(t, 2, 60*time.Second, second)
		deadline := time.Now().Add(60 * time.Second)
		for first.c.Stats().Workers != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the replaced member still runs %d workers", first.c.Stats().Workers)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for {
			if _, ok := logs.find(slog.LevelError, "another live member holds this member's instance id"); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the replaced member did not say that another live member holds its instance id")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := first.c.Ready(); !errors.Is(err, processor.ErrInstanceHeld) || !strings.Contains(err.Error(), `"same"`) {
			t.Errorf("the refused member's Ready() = %v, want an error saying another member holds its instance id", err)
		}
		if err := second.c.Ready(); err != nil {
			t.Errorf("the member holding the instance id: Ready() = %v, want nil", err)
		}
		e.produceMessages(stream.Messages[len(stream.Messages)/2:])
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		if got := first.c.Stats().Workers; got != 0 {
			t.Errorf("the replaced member runs %d workers, want 0", got)
		}
		first.stop(t)
		if r, ok := logs.find(slog.LevelWarn, "leave group"); ok {
			t.Errorf("the refused member warned on its leave: %v", r)
		}
		if _, ok := logs.find(slog.LevelInfo, "another member holds this member's instance id: this member had nothing to leave"); !ok {
			var said []string
			for _, m := range logs.messages() {
				if strings.Contains(m, "leav") {
					said = append(said, m)
				}
			}
			t.Errorf("the refused member did not say that it had nothing to leave; of leaving it said %q", said)
		}
		second.stop(t)
		e.checkExactlyOnce(stream.Unique)
	})
}

// A group whose members use both protocols (a deploy half rolled from one
// to the other) is warned about whichever protocol joined first: on
// Kafka 4.1 a consumer-protocol member turns a classic group into a
// consumer-protocol group that keeps its classic members (the broker's
// online upgrade), and a classic member joins a consumer-protocol group
// the same way; kfake refuses the consumer member of a classic group
// instead. The warning is one line naming the group and both protocols,
// and says what to do.
func TestMixedProtocolGroupIsWarned(t *testing.T) {
	for _, first := range []processor.GroupProtocol{processor.ClassicProtocol, processor.ConsumerProtocol} {
		second := processor.ConsumerProtocol
		if first == second {
			second = processor.ClassicProtocol
		}
		t.Run(string(first)+"-first", func(t *testing.T) {
			eachPlainBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 4)
				logs := &logRecorder{}
				cfg := e.protocolConfig("first", first, "")
				cfg.Logger = slog.New(logs)
				m1 := e.start(cfg, e.writer(100))
				waitWorkers(t, 4, 60*time.Second, m1)
				// The first member has checked the group's protocol
				// before the second comes.
				deadline := time.Now().Add(60 * time.Second)
				for {
					if _, ok := logs.find(slog.LevelInfo, "consumer group joined"); ok {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the first member did not say it joined; it said %q", logs.messages())
					}
					time.Sleep(50 * time.Millisecond)
				}
				logs2 := &logRecorder{}
				cfg = e.protocolConfig("second", second, "")
				cfg.Logger = slog.New(logs2)
				m2 := e.start(cfg, e.writer(100))
				const mixed = "mixes the classic and consumer protocols"
				var line map[string]string
				for {
					r, ok := logs.find(slog.LevelWarn, mixed)
					if !ok {
						r, ok = logs2.find(slog.LevelWarn, mixed)
					}
					if ok {
						line = r
						break
					}
					if time.Now().After(deadline) {
						var said []string
						for _, m := range append(logs.messages(), logs2.messages()...) {
							if strings.Contains(m, "protocol") {
								said = append(said, m)
							}
						}
						t.Fatalf("no member warned that the group %s; of protocols they said %q", mixed, said)
					}
					time.Sleep(50 * time.Millisecond)
				}
				t.Logf("warning: %v", line)
				if line["group"] != e.group || !strings.Contains(line["msg"], "kafka.group_protocol") {
					t.Errorf("the warning %v does not name the group %s and what to do (kafka.group_protocol)", line, e.group)
				}
				for _, l := range []*logRecorder{logs, logs2} {
					if n := l.count(slog.LevelWarn, mixed); n > 1 {
						t.Errorf("a member warned %d times of the mixed group, want one line", n)
					}
				}
				m1.stop(t)
				m2.stop(t)
			})
		})
	}
}
