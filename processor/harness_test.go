package processor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// EnvKafka names the environment variable with a real Kafka's brokers
// (comma-separated). The suite always runs on kfake, and on real Kafka too
// when it is set; with CI set it must be, unless ONCEFLOW_TEST_KFAKE_ONLY is.
const EnvKafka = "ONCEFLOW_TEST_KAFKA_BROKERS"

// broker is one Kafka the suite runs against.
type broker struct {
	name  string
	start func(t *testing.T, topic string, partitions int32, extraTopics ...string) []string
}

func brokers(t *testing.T) []broker {
	bs := []broker{{name: "kfake", start: startKfake}}
	switch addrs := os.Getenv(EnvKafka); {
	case addrs != "":
		bs = append(bs, broker{name: "kafka", start: func(t *testing.T, topic string, partitions int32, extra ...string) []string {
			seeds := strings.Split(addrs, ",")
			createTopics(t, seeds, partitions, append([]string{topic}, extra...)...)
			return seeds
		}})
	case os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "":
		t.Fatalf("%s is not set and CI is: the suite must also run on a real Kafka (infra/kafka.sh start)", EnvKafka)
	}
	if b, ok := secureBrokerCase(t); ok {
		bs = append(bs, b)
	}
	return bs
}

// eachBroker runs f as a subtest per broker; the subtest name says which.
func eachBroker(t *testing.T, f func(t *testing.T, b broker)) {
	runEach(t, brokers(t), f)
}

// eachPlainBroker is eachBroker without the SASL_SSL broker, for the
// scenarios whose cost is the broker's own timing (a recreated topic's
// detection, a group's sessions) and to which the transport adds nothing:
// they run on kfake and the plaintext Kafka.
func eachPlainBroker(t *testing.T, f func(t *testing.T, b broker)) {
	bs := brokers(t)
	runEach(t, slices.DeleteFunc(bs, func(b broker) bool { return b.name != "kfake" && b.name != "kafka" }), f)
}

func runEach(t *testing.T, bs []broker, f func(t *testing.T, b broker)) {
	for _, b := range bs {
		t.Run(b.name, func(t *testing.T) {
			t.Logf("broker: %s", b.name)
			f(t, b)
		})
	}
}

func startKfake(t *testing.T, topic string, partitions int32, extra ...string) []string {
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake848,
	)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	seeds := c.ListenAddrs()
	createTopics(t, seeds, partitions, append([]string{topic}, extra...)...)
	return seeds
}

// kfake848 gives kfake's consumer-protocol (KIP-848) groups the session
// and heartbeat the tests give classic groups (config): the broker, not
// the member, sets them under that protocol.
var kfake848 = kfake.BrokerConfigs(map[string]string{
	"group.consumer.session.timeout.ms":    "3000",
	"group.consumer.heartbeat.interval.ms": "300",
})

// createTopics creates the first topic with the given partitions and the
// others with one, and deletes them at cleanup.
func createTopics(t *testing.T, seeds []string, partitions int32, topics ...string) {
	for i, topic := range topics {
		p := partitions
		if i > 0 {
			p = 1
		}
		createTopic(t, seeds, topic, p, nil)
	}
}

// createTopic creates one topic with configs (nil for the broker's
// defaults) and deletes it at cleanup.
func createTopic(t *testing.T, seeds []string, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	cl, err := seedClient(seeds)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s on %v: %v", topic, seeds, err)
	}
	t.Cleanup(func() {
		cl, err := seedClient(seeds)
		if err != nil {
			return
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, topic)
	})
}

// env is one test's Kafka topic, consumer group and Postgres schema.
type env struct {
	t       *testing.T
	brokers []string
	topic   string
	group   string
	dlq     string
	pool    *pgxpool.Pool
	schema  string
}

func newEnv(t *testing.T, b broker, partitions int32) *env {
	var r [4]byte
	_, _ = rand.Read(r[:])
	suffix := hex.EncodeToString(r[:])
	pool := sinktest.Pool(t)
	e := &env{t: t, topic: "orders-" + suffix, group: "onceflow-" + suffix, dlq: "orders-" + suffix + ".dlq",
		pool: pool, schema: sinktest.Schema(t, pool, orders.Migrate)}
	e.brokers = b.start(t, e.topic, partitions, e.dlq)
	return e
}

func (e *env) client(opts ...kgo.Opt) *kgo.Client {
	cl, err := seedClient(e.brokers, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cl.Close)
	return cl
}

// produce publishes recs synchronously, in order.
func (e *env) produce(recs ...*kgo.Record) {
	e.t.Helper()
	cl := e.client(kgo.DefaultProduceTopic(e.topic))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

func (e *env) produceMessages(msgs []orders.Message) {
	e.t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
	}
	e.produce(recs...)
}

func (e *env) writer(cacheSize int) *sink.Writer {
	e.t.Helper()
	hs, err := orders.Handlers(e.schema)
	if err != nil {
		e.t.Fatal(err)
	}
	cache, err := dedup.New(cacheSize)
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := sink.New(e.pool, sink.Config{Schema: e.schema, Group: e.group, Handlers: hs, Cache: cache})
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// config is the consumer config tests use: small batches and fast group
// timeouts so rebalances happen within a test.
func (e *env) config(name string) processor.Config {
	var log *slog.Logger
	if os.Getenv("ONCEFLOW_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("member", name)
	}
	return processor.Config{
		Logger:  log,
		Brokers: e.brokers, Topics: []string{e.topic}, Group: e.group, ClientID: name,
		BatchMaxRecords: 100, BatchLinger: 20 * time.Millisecond,
		Decode:          processor.DecodeConfig{MaxBytes: 1024},
		DeadLetterTopic: e.dlq,
		SessionTimeout:  3 * time.Second, RebalanceTimeout: 5 * time.Second, DrainTimeout: 2 * time.Second,
		CommitInterval: 200 * time.Millisecond,
		RetryBackoff:   20 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond,
		KafkaOptions: append([]kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond), kgo.HeartbeatInterval(300 * time.Millisecond),
			kgo.FetchMaxWait(200 * time.Millisecond)}, security(e.brokers)...),
	}
}

// member is one running Consumer.
type member struct {
	c      *processor.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (e *env) start(cfg processor.Config, w processor.Writer) *member {
	e.t.Helper()
	c, err := processor.New(cfg, w)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(ctx) }()
	e.t.Cleanup(func() { m.stop(e.t) })
	return m
}

// stop cancels the member and waits for Run to return (drained).
func (m *member) stop(t *testing.T) {
	t.Helper()
	m.once.Do(func() {
		m.cancel()
		select {
		case err := <-m.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("member did not stop within 60s")
		}
	})
}

// processed counts distinct events that emailHandler has applied.
func (e *env) processed() int64 {
	return sinktest.Count(e.t, e.pool, `SELECT count(*) FROM `+e.schema+`.processed_events WHERE handler = 'emailHandler'`)
}

// waitProcessed waits until n events are processed, failing after timeout.
func (e *env) waitProcessed(n int64, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := e.processed()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("processed %d events within %v, want %d", got, timeout, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) checkExactlyOnce(want map[uuid.UUID]orders.Order) {
	e.t.Helper()
	rep, err := orders.Check(context.Background(), e.pool, e.schema, want)
	if err != nil {
		e.t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		e.t.Fatalf("effects not exactly once:\n%s", strings.Join(rep.Problems, "\n"))
	}
}
