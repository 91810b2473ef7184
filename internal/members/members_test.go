package members_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	brokers []string
	topic   string
	group   string
	schema  string
	cfg     members.InProcessConfig
	start   members.Starter
}

// eachBroker runs f on kfake, and on the real Kafka named by
// ONCEFLOW_TEST_KAFKA_BROKERS when it is set; the subtest's name says which.
func eachBroker(t *testing.T, f func(t *testing.T, real []string)) {
	t.Run("kfake", func(t *testing.T) { f(t, nil) })
	if addrs := os.Getenv("ONCEFLOW_TEST_KAFKA_BROKERS"); addrs != "" {
		t.Run("kafka", func(t *testing.T) { f(t, strings.Split(addrs, ",")) })
	}
}

// newEnv makes a topic of partitions on kfake, or on the real brokers when
// real is set, and a schema with the orders tables.
func newEnv(t *testing.T, partitions int32, real []string) *env {
	var r [4]byte
	_, _ = rand.Read(r[:])
	e := &env{topic: "orders-" + hex.EncodeToString(r[:]), group: "g-" + hex.EncodeToString(r[:])}
	if real == nil {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, e.topic),
			kfake.GroupMinSessionTimeout(100*time.Millisecond),
			// The consumer protocol's session and heartbeat are the
			// broker's: as Tuned's.
			kfake.BrokerConfigs(map[string]string{
				"group.consumer.session.timeout.ms":    "3000",
				"group.consumer.heartbeat.interval.ms": "300",
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		e.brokers = c.ListenAddrs()
	} else {
		e.brokers = real
		createTopic(t, real, e.topic, partitions)
	}
	pool := sinktest.Pool(t)
	e.schema = sinktest.Schema(t, pool, orders.Migrate)
	hs, err := orders.Handlers(e.schema)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg = members.InProcessConfig{
		Pool: pool, LRUSize: 1000,
		Consumer: members.Tuned(processor.Config{Brokers: e.brokers, Topics: []string{e.topic}, Group: e.group,
			BatchMaxRecords: 100, BatchLinger: 20 * time.Millisecond}),
		Writer: sink.Config{Schema: e.schema, Group: e.group, Handlers: hs},
	}
	e.start = members.InProcess(e.cfg)
	return e
}

func createTopic(t *testing.T, brokers []string, topic string, partitions int32) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(t.Context(), partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, topic)
	})
}

func (e *env) produce(t *testing.T, s orders.Stream) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(s.Messages))
	for i, m := range s.Messages {
		recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// Members join, leave and crash while a stream with redeliveries is
// consumed; the group waits until everything committed, stops every
// member, and the effects are exactly once: under both group protocols,
// passed to the members in InProcessConfig.Consumer.
func TestGroupChurnsAndStops(t *testing.T) {
	for _, p := range []processor.GroupProtocol{processor.ClassicProtocol, processor.ConsumerProtocol} {
		t.Run(string(p), func(t *testing.T) {
			eachBroker(t, func(t *testing.T, real []string) { groupChurnsAndStops(t, real, p) })
		})
	}
}

func groupChurnsAndStops(t *testing.T, real []string, protocol processor.GroupProtocol) {
	e := newEnv(t, 4, real)
	e.cfg.Consumer.GroupProtocol = protocol
	e.start = members.InProcess(e.cfg)
	stream, err := orders.Generate(3000, 0.3, 11)
	if err != nil {
		t.Fatal(err)
	}
	e.produce(t, stream)
	g := members.NewGroup(e.start)
	defer func() {
		if err := g.StopAll(); err != nil {
			t.Error(err)
		}
	}()
	for range 2 {
		if _, err := g.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	var crashes int
	for n := 1; n <= 3; n++ {
		crashed, err := g.Churn(t.Context(), n)
		if err != nil {
			t.Fatal(err)
		}
		if crashed {
			crashes++
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	pool := sinktest.Pool(t)
	if err := members.WaitCommitted(ctx, pool, e.schema, e.group, int64(len(stream.Messages)), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := g.StopAll(); err != nil {
		t.Fatal(err)
	}
	if c := g.Counts(); c != (members.Counts{Started: 5, Running: 0, Left: 2, Crashed: 1}) || crashes != 1 {
		t.Errorf("counts %+v, %d crashes; want 5 started, 2 left, 1 crashed (the third change)", c, crashes)
	}
	if s := g.Stats(); s.RecordsConsumed < int64(len(stream.Messages)) || s.Assigned == 0 {
		t.Errorf("stats over every member: %+v; want every record consumed at least once", s)
	}
	rep, err := orders.Check(t.Context(), pool, e.schema, stream.Unique)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once:\n%s", strings.Join(rep.Problems, "\n"))
	}
}

// A starter that fails leaves the members started before it running for
// StopAll, which stops them; nothing leaks (goleak checks).
func TestStopAllAfterAFailedStart(t *testing.T) {
	e := newEnv(t, 2, nil)
	calls := 0
	g := members.NewGroup(func(ctx context.Context, name string) (members.Member, error) {
		calls++
		if calls == 3 {
			return nil, errors.New("no more")
		}
		return e.start(ctx, name)
	})
	for range 2 {
		if _, err := g.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "start member-3: no more") {
		t.Fatalf("third start: %v", err)
	}
	if err := g.StopAll(); err != nil {
		t.Fatal(err)
	}
	if c := g.Counts(); c.Started != 2 || c.Running != 0 {
		t.Errorf("counts %+v, want 2 started, none running", c)
	}
	if ok, err := g.Leave(); ok || err != nil {
		t.Errorf("Leave with no member: %v, %v", ok, err)
	}
}

func TestCrashTurn(t *testing.T) {
	var got []bool
	for n := 1; n <= 6; n++ {
		got = append(got, members.CrashTurn(n))
	}
	if want := []bool{false, false, true, false, false, true}; !slices.Equal(got, want) {
		t.Errorf("crash turns %v, want %v", got, want)
	}
}

// With Kill, a crash is a SIGKILL's: the member does not leave the
// group, so its partitions stay its own until the group's session timeout
// (3s, Tuned) expires. Without, the aborted member's client leaves as it
// closes.
func TestKilledMemberStaysInTheGroup(t *testing.T) {
	eachBroker(t, func(t *testing.T, real []string) { crashLeaves(t, real, true) })
}

func TestAbortedMemberLeavesTheGroup(t *testing.T) {
	eachBroker(t, func(t *testing.T, real []string) { crashLeaves(t, real, false) })
}

func crashLeaves(t *testing.T, real []string, kill bool) {
	e := newEnv(t, 2, real)
	e.cfg.Kill = kill
	g := members.NewGroup(members.InProcess(e.cfg))
	defer func() { _ = g.StopAll() }()
	m, err := g.Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for m.Stats().Workers < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the member has %d workers after 30s, want 2", m.Stats().Workers)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := g.Crash(); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	groups, err := kadm.NewClient(cl).DescribeGroups(t.Context(), e.group)
	if err != nil {
		t.Fatal(err)
	}
	d := groups[e.group]
	if since := time.Since(crashed); since > 2*time.Second {
		t.Fatalf("describing the group took %v: too long to tell a leave from the session timeout", since)
	}
	if want := map[bool]int{true: 1, false: 0}[kill]; len(d.Members) != want {
		t.Errorf("kill %v: %d members in the group %v after the crash (state %s), want %d", kill,
			len(d.Members), time.Since(crashed), d.State, want)
	}
}

// With InProcessConfig.Consumer.InstanceID set, each member is static
// under an id of its own: the prefix and its name. Two members of one
// group with one id would fence each other.
func TestInProcessInstanceIDs(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.cfg.Consumer.InstanceID = "bench"
	g := members.NewGroup(members.InProcess(e.cfg))
	defer func() {
		if err := g.StopAll(); err != nil {
			t.Error(err)
		}
	}()
	for range 2 {
		if _, err := g.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for {
		described, err := kadm.NewClient(cl).DescribeGroups(ctx, e.group)
		if err == nil {
			var got []string
			for _, m := range described[e.group].Members {
				if m.InstanceID != nil {
					got = append(got, *m.InstanceID)
				}
			}
			slices.Sort(got)
			if slices.Equal(got, []string{"bench-member-1", "bench-member-2"}) {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the group's members never had the instance ids bench-member-1 and bench-member-2 (last: %v, %v)", described, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Restart crashes the longest-running member and starts it again under
// its name: the group's other members and the count of running ones stay
// as they were.
func TestRestartKeepsTheName(t *testing.T) {
	e := newEnv(t, 2, nil)
	var names []string
	g := members.NewGroup(func(ctx context.Context, name string) (members.Member, error) {
		names = append(names, name)
		return e.start(ctx, name)
	})
	defer func() {
		if err := g.StopAll(); err != nil {
			t.Error(err)
		}
	}()
	for range 2 {
		if _, err := g.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	m, err := g.Restart(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if m == nil || m.Name() != "member-1" {
		t.Fatalf("Restart returned %v, want member-1 started again", m)
	}
	if want := []string{"member-1", "member-2", "member-1"}; !slices.Equal(names, want) {
		t.Errorf("started %v, want %v", names, want)
	}
	if c := g.Counts(); c.Started != 3 || c.Running != 2 || c.Crashed != 1 {
		t.Errorf("counts %+v, want 3 started, 2 running, 1 crashed", c)
	}
}
