package processor_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
)

// A classic member with a short session (3s, which a broker whose
// group.min.session.timeout.ms allows accepts) heartbeats often enough to
// keep it: the heartbeat interval follows the session, so the member keeps
// its partitions, with no loss and no revoke, for several sessions in a
// row. With franz-go's fixed 3s heartbeat it lost them every few seconds
// (UNKNOWN_MEMBER_ID), for ever.
func TestClassicShortSessionKeepsPartitions(t *testing.T) {
	bs := slices.DeleteFunc(brokers(t), func(b broker) bool { return b.name != "kafka" })
	if len(bs) == 0 {
		t.Skipf("%s is not set: the session is the real broker's to keep", EnvKafka)
	}
	runEach(t, bs, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		stream, err := orders.Generate(20, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		cfg := e.config("m1")
		// The session the config gives, with no heartbeat interval of
		// the test's own.
		cfg.SessionTimeout, cfg.RebalanceTimeout = 3*time.Second, 5*time.Second
		cfg.KafkaOptions = append([]kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond), kgo.FetchMaxWait(200 * time.Millisecond)},
			security(e.brokers)...)
		m := e.start(cfg, e.writer(100))
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		// Five sessions: a member whose heartbeats come too late loses
		// its partitions within each.
		time.Sleep(5 * cfg.SessionTimeout)
		s := m.c.Stats()
		if s.Lost != 0 || s.Revoked != 0 || s.Assigned != 2 {
			t.Errorf("over 15s with a 3s session: %d partitions lost, %d revoked, %d assigned; want 0, 0, 2", s.Lost, s.Revoked, s.Assigned)
		}
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
	})
}

// A session the brokers refuse (below their group.min.session.timeout.ms,
// 6s by default) is a configuration error: the member stops, Run
// returning ErrSessionRefused, instead of asking to join for ever.
func TestRefusedSessionStopsTheMember(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	e := newEnv(t, broker{name: "kfake", start: func(t *testing.T, topic string, partitions int32, extra ...string) []string {
		createTopics(t, cluster.ListenAddrs(), partitions, append([]string{topic}, extra...)...)
		return cluster.ListenAddrs()
	}}, 1)
	m := e.start(e.config("m1"), e.writer(100)) // a 3s session
	var runErr error
	select {
	case runErr = <-m.done:
		m.once.Do(func() {}) // collected here
	case <-time.After(60 * time.Second):
		t.Fatal("a member whose session the brokers refuse did not stop")
	}
	if !errors.Is(runErr, processor.ErrSessionRefused) || !strings.Contains(runErr.Error(), "kafka.session_timeout 3s") {
		t.Fatalf("Run returned %v, want ErrSessionRefused naming kafka.session_timeout 3s", runErr)
	}
	if err := m.c.Ready(); !errors.Is(err, processor.ErrSessionRefused) {
		t.Errorf("Ready() = %v, want ErrSessionRefused", err)
	}
}
