package processor_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/wire"
)

// A member told to consume a topic the brokers do not have says so — a
// warning naming the topic, once — and when the topic is created, says
// that too and consumes it.
func TestMissingTopicWarns(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		missing := e.topic + "-later"
		logs := &logRecorder{}
		cfg := e.config("missing-topic")
		cfg.Topics = []string{missing}
		cfg.Logger = slog.New(logs)
		m := e.start(cfg, e.writer(0))
		defer m.stop(t)

		rec := waitLogged(t, logs, slog.LevelWarn, "does not exist", 30*time.Second)
		if rec["topic"] != missing {
			t.Errorf("the warning names topic %q, want %q: %v", rec["topic"], missing, rec)
		}

		createTopic(t, e.brokers, missing, 1, nil)
		waitLogged(t, logs, slog.LevelInfo, "exists now", 30*time.Second)
		stream, err := orders.Generate(50, 0, 7)
		if err != nil {
			t.Fatal(err)
		}
		e.topic = missing
		e.produceMessages(stream.Messages)
		e.waitProcessed(50, 60*time.Second)
		if n := logs.count(slog.LevelWarn, "does not exist"); n != 1 {
			t.Errorf("the missing topic was warned about %d times, want once", n)
		}
	})
}

// waitLogged waits until logs holds a record at level whose message
// contains s, and returns it.
func waitLogged(t *testing.T, logs *logRecorder, level slog.Level, s string, timeout time.Duration) map[string]string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if rec, ok := logs.find(level, s); ok {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing logged at %v containing %q within %v; logged: %v", level, s, timeout, logs.messages())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A member told to consume a topic whose metadata the brokers refuse (no
// ACL lets its user describe it), beside one they do not have, says both:
// a warning naming each. kfake only: its ACLs refuse the topic.
func TestRefusedTopicWarns(t *testing.T) {
	admin := plain.Auth{User: "admin", Pass: "admin"}.AsMechanism()
	allow := func(r kmsg.ACLResourceType, name string, p kmsg.ACLResourcePatternType) kfake.ACL {
		return kfake.ACL{Resource: r, Name: name, Pattern: p, Operation: kmsg.ACLOperationAll, Allow: true}
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", "admin"), kfake.EnableACLs(),
		kfake.User("PLAIN", "app", "app",
			allow(kmsg.ACLResourceTypeTopic, "orders-", kmsg.ACLResourcePatternTypePrefixed),
			allow(kmsg.ACLResourceTypeGroup, "onceflow-", kmsg.ACLResourcePatternTypePrefixed),
			allow(kmsg.ACLResourceTypeCluster, "kafka-cluster", kmsg.ACLResourcePatternTypeLiteral)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	e := newEnv(t, broker{name: "kfake", start: func(t *testing.T, topic string, partitions int32, extra ...string) []string {
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.SASL(admin))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		for _, tp := range append([]string{topic}, extra...) {
			if _, err := kadm.NewClient(cl).CreateTopic(t.Context(), partitions, 1, nil, tp); err != nil {
				t.Fatal(err)
			}
		}
		return cluster.ListenAddrs()
	}}, 1)
	missing, refused := e.topic+"-later", "secret-"+e.topic
	logs := &logRecorder{}
	cfg := e.config("refused-topic")
	cfg.Topics = []string{e.topic, missing, refused}
	cfg.Logger = slog.New(logs)
	cfg.KafkaOptions = append(cfg.KafkaOptions, kgo.SASL(plain.Auth{User: "app", Pass: "app"}.AsMechanism()))
	m := e.start(cfg, e.writer(0))
	defer m.stop(t)

	rec := waitLogged(t, logs, slog.LevelWarn, "does not exist", 30*time.Second)
	if rec["topic"] != missing {
		t.Errorf("the warning names topic %q, want %q: %v", rec["topic"], missing, rec)
	}
	rec = waitLogged(t, logs, slog.LevelWarn, "refuse", 30*time.Second)
	if rec["topic"] != refused {
		t.Errorf("the warning names topic %q, want %q: %v", rec["topic"], refused, rec)
	}
}

// A consumed topic deleted while the member runs is said once (a warning
// naming it), and the member's log is not flooded after that: each of its
// partitions' fetch and commit failures is said a few times at most, not
// at every poll. (Each poll logged a "fetch error" — hundreds a second on
// a real Kafka — and kgo's failed commits logged at every commit.)
func TestDeletedTopicLogsNoFlood(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		logs := &logRecorder{}
		cfg := e.config("deleted-topic")
		cfg.Logger = slog.New(logs)
		m := e.start(cfg, e.writer(0))
		defer m.stop(t)
		stream, err := orders.Generate(50, 0, 7)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)

		cl, err := seedClient(e.brokers)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kadm.NewClient(cl).DeleteTopics(t.Context(), e.topic)
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		rec := waitLogged(t, logs, slog.LevelWarn, "does not exist", 30*time.Second)
		if rec["topic"] != e.topic {
			t.Errorf("the warning names topic %q, want %q: %v", rec["topic"], e.topic, rec)
		}
		before := logs.problems()
		time.Sleep(5 * time.Second)
		if n := logs.problems() - before; n > 10 {
			msgs := logs.messages()
			t.Errorf("%d warnings and errors logged in the 5s after the deleted topic was said, want a few at most; the last: %v",
				n, msgs[max(0, len(msgs)-6):])
		}
	})
}

// Partitions added to a consumed topic while members run are assigned
// and consumed within seconds under the classic protocol too: the group's
// leader rebalances when its client's metadata shows them, which the
// member's look at the topics (every 3 s) refreshes, where the client's
// own refresh (MetadataMaxAge, 5 minutes by default) left them unread.
// Also right after the topic was recreated: the client learned the new
// topic (consuming it) before the partitions were added, and the look may
// see the new id and the new partitions at once.
func TestAddedPartitionsAreConsumed(t *testing.T) {
	for _, recreated := range []bool{false, true} {
		t.Run(map[bool]string{false: "added", true: "added after a recreation"}[recreated], func(t *testing.T) {
			eachBroker(t, func(t *testing.T, b broker) { addedPartitions(t, b, recreated) })
		})
	}
}

func addedPartitions(t *testing.T, b broker, recreated bool) {
	e := newEnv(t, b, 1)
	first, err := orders.Generate(50, 0, 21)
	if err != nil {
		t.Fatal(err)
	}
	e.produceMessages(first.Messages)
	logs := &logRecorder{}
	cfg := e.config("grows")
	cfg.Logger = slog.New(logs)
	m := e.start(cfg, e.writer(0))
	defer m.stop(t)
	e.waitProcessed(50, 60*time.Second)
	want := int64(50)
	if recreated {
		e.recreateTopic()
		again, err := orders.Generate(20, 0, 23)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(again.Messages)
		want += 20
		e.waitProcessed(want, 60*time.Second)
	}

	adm := kadm.NewClient(e.client())
	if resp, err := adm.CreatePartitions(t.Context(), 2, e.topic); err != nil || resp.Error() != nil {
		t.Fatalf("add partitions: %v %v", err, resp.Error())
	}
	added := time.Now()
	second, err := orders.Generate(40, 0, 22)
	if err != nil {
		t.Fatal(err)
	}
	cl := e.client(kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.MetadataMinAge(100*time.Millisecond))
	for i, msg := range second.Messages {
		r := wire.NewRecord(e.topic, msg.ID, msg.Value)
		r.Partition = int32(1 + i%2)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			err := cl.ProduceSync(t.Context(), r).FirstErr()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("produce to partition %d: %v", r.Partition, err)
			}
		}
	}
	e.waitProcessed(want+40, 30*time.Second)
	t.Logf("the added partitions consumed %v after they were added", time.Since(added).Round(time.Millisecond))
	if _, ok := logs.find(slog.LevelInfo, "partitions added"); !ok && !recreated {
		t.Errorf("no line saying partitions were added: %v", logs.messages())
	}
}
