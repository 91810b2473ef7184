package processor_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// envMember turns the test binary into a bare group member (see
// runMemberProcess), so a test can kill a member with SIGKILL.
const envMember = "ONCEFLOW_TEST_MEMBER"

func TestMain(m *testing.M) {
	if os.Getenv(envMember) != "" {
		runMemberProcess()
		return
	}
	goleak.VerifyTestMain(m)
}

// runMemberProcess runs one consumer until it is killed or gets SIGTERM.
// Its Kafka commits are effectively off (one per hour), so when it is
// killed Kafka knows nothing of its progress: only Postgres does. It logs
// JSON on stderr, including one "test.write" line per Write with the
// batch's epoch and error. ONCEFLOW_TEST_WRITE_DELAY delays every Write
// (default 10ms), so a killed or stopped member has a batch in hand.
func runMemberProcess() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	pool, err := pgxpool.New(ctx, os.Getenv(sinktest.EnvDSN))
	if err != nil {
		os.Exit(3)
	}
	schema, group, topic := os.Getenv("ONCEFLOW_TEST_SCHEMA"), os.Getenv("ONCEFLOW_TEST_GROUP"), os.Getenv("ONCEFLOW_TEST_TOPIC")
	hs, _ := orders.Handlers(schema)
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: group, Handlers: hs})
	if err != nil {
		os.Exit(4)
	}
	delay, err := time.ParseDuration(os.Getenv("ONCEFLOW_TEST_WRITE_DELAY"))
	if err != nil {
		delay = 10 * time.Millisecond
	}
	seeds := strings.Split(os.Getenv("ONCEFLOW_TEST_BROKERS"), ",")
	c, err := processor.New(processor.Config{
		Brokers: seeds, Topics: []string{topic}, Group: group,
		BatchMaxRecords: 50, CommitInterval: time.Hour, Logger: log,
		SessionTimeout: 3 * time.Second, RebalanceTimeout: 5 * time.Second, DrainTimeout: 2 * time.Second,
		KafkaOptions: append([]kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond), kgo.HeartbeatInterval(300 * time.Millisecond)},
			security(seeds)...),
	}, slowWriter{w, delay, log})
	if err != nil {
		os.Exit(5)
	}
	_ = c.Run(ctx)
}

// slowWriter delays every batch, so a killed member dies mid-stream, and
// logs each write's epoch and outcome.
type slowWriter struct {
	*sink.Writer
	delay time.Duration
	log   *slog.Logger
}

func (s slowWriter) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	time.Sleep(s.delay)
	res, err := s.Writer.Write(ctx, b)
	if s.log != nil {
		s.log.Info("test.write", "partition", b.Partition, "epoch", b.Epoch, "next_offset", b.NextOffset, "ok", err == nil, "err", fmt.Sprint(err))
	}
	return res, err
}

// process is a member running in a child process.
type process struct {
	cmd *exec.Cmd
	log *syncBuffer
}

// startProcess starts a member in a child process (see runMemberProcess);
// it is killed at cleanup if still running.
func (e *env) startProcess(writeDelay time.Duration) *process {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envMember+"=1",
		"ONCEFLOW_TEST_SCHEMA="+e.schema, "ONCEFLOW_TEST_GROUP="+e.group, "ONCEFLOW_TEST_TOPIC="+e.topic,
		"ONCEFLOW_TEST_BROKERS="+strings.Join(e.brokers, ","), "ONCEFLOW_TEST_WRITE_DELAY="+writeDelay.String())
	p := &process{cmd: cmd, log: &syncBuffer{}}
	cmd.Stderr = p.log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if e.t.Failed() {
			e.t.Logf("child member log:\n%s", p.log.String())
		}
	})
	return p
}

// waitLog waits until the child's log has a line containing s.
func (p *process) waitLog(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.log.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("the child member did not log %q within %v", s, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A member that dies hard (SIGKILL: no Kafka commit, no leave) mid-stream
// is replaced; every effect happens once, and the replacement resumes from
// the offset stored in Postgres, so it re-reads nothing already applied.
func TestHardKilledMemberCostsNoReplay(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 4)
		stream, err := orders.Generate(4000, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)

		child := e.startProcess(10 * time.Millisecond)
		e.waitProcessed(500, 60*time.Second)
		if err := child.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = child.cmd.Wait()
		atKill := e.processed()
		// Offsets start at 0 and every record is an event, so the stored
		// next offsets add up to the records already applied.
		storedAtKill := sinktest.Count(t, e.pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+e.schema+`.sink_offsets`)
		if atKill >= int64(len(stream.Unique)) {
			t.Fatalf("the member finished all %d events before it was killed: the test proves nothing", atKill)
		}
		t.Logf("member killed after %d of %d events", atKill, len(stream.Unique))

		m := e.start(e.config("replacement"), e.writer(0))
		e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
		// No duplicates were published, so any key found already claimed
		// would be a replay of applied work.
		s := m.c.Stats()
		if s.SkippedPostgres != 0 || s.SkippedLRU != 0 {
			t.Errorf("replacement re-applied events: skipped %d by postgres, %d by lru; want 0",
				s.SkippedPostgres, s.SkippedLRU)
		}
		if remaining := int64(len(stream.Messages)) - storedAtKill; s.RecordsConsumed > remaining {
			t.Errorf("replacement fetched %d records, want at most the %d after the offsets stored in Postgres",
				s.RecordsConsumed, remaining)
		}
	})
}

// Members join and leave (cleanly) while a stream with 30% redeliveries is
// consumed: every effect happens once.
func TestRebalanceChurn(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 6)
		stream, err := orders.Generate(6000, 0.3, 2)
		if err != nil {
			t.Fatal(err)
		}
		half := len(stream.Messages) / 2
		w := e.writer(10000)
		m1 := e.start(e.config("m1"), w)
		e.produceMessages(stream.Messages[:half])
		m2 := e.start(e.config("m2"), w)
		e.waitProcessed(1000, 60*time.Second)
		m1.stop(t)
		m3 := e.start(e.config("m3"), e.writer(0)) // a member with no cache: Postgres alone dedups
		e.produceMessages(stream.Messages[half:])
		e.waitProcessed(3000, 60*time.Second)
		m2.stop(t)
		e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
		m3.stop(t)
		e.checkExactlyOnce(stream.Unique)
		total := m1.c.Stats().Assigned + m2.c.Stats().Assigned + m3.c.Stats().Assigned
		if total <= 6 {
			t.Errorf("partitions assigned %d times over the test, want more than 6 (rebalances happened)", total)
		}
	})
}

// One partition receives new events, redeliveries of events from earlier
// batches, an event twice in a row (inside one batch) and every kind of
// poison record. Valid events take effect once; each poison record is a
// dead letter in Postgres and on the dead-letter topic, with its reason;
// the partition keeps going past them.
func TestMixedStreamWithPoison(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(300, 0, 4)
		if err != nil {
			t.Fatal(err)
		}
		msgs := stream.Messages
		rec := func(m orders.Message) *kgo.Record { return wire.NewRecord(e.topic, m.ID, m.Value) }
		badOrder := uuid.New()
		poison := []struct {
			rec    *kgo.Record
			reason string
		}{
			{&kgo.Record{Topic: e.topic, Value: []byte(`{"user_id":1,"items":["A"]}`)}, "no event_id header"},
			{&kgo.Record{Topic: e.topic, Value: []byte(`{"user_id":1,"items":["A"]}`),
				Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("order-17")}}}, "is not a UUID"},
			{wire.NewRecord(e.topic, uuid.New(), []byte(`{"user_id":1,`)), "not valid JSON"},
			{wire.NewRecord(e.topic, uuid.New(), []byte("{\"user_id\":1,\"items\":[\"\x00\"]}")), "NUL byte"},
			{wire.NewRecord(e.topic, uuid.New(), []byte(`{"items":["`+strings.Repeat("A", 2000)+`"]}`)), "over the 1024-byte limit"},
			{wire.NewRecord(e.topic, badOrder, []byte(`{"user_id":"one","items":["A"]}`)), "rejected: not an order"},
		}
		var first []*kgo.Record
		for i, m := range msgs[:150] {
			first = append(first, rec(m))
			if i%25 == 0 {
				first = append(first, poison[(i/25)%len(poison)].rec)
			}
			if i == 40 {
				first = append(first, rec(m)) // the same event twice in a row: one batch
			}
		}
		e.produce(first...)
		m := e.start(e.config("mixed"), e.writer(1000))
		e.waitProcessed(150, 60*time.Second)

		var second []*kgo.Record
		for i, msg := range msgs[150:] {
			second = append(second, rec(msg), rec(msgs[i%150])) // new event, then a redelivery of an old one
		}
		e.produce(second...)
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)

		s := m.c.Stats()
		if s.SkippedLRU+s.SkippedPostgres != 151*4 {
			t.Errorf("skipped %d (lru) + %d (postgres) keys, want %d", s.SkippedLRU, s.SkippedPostgres, 151*4)
		}
		for _, p := range poison {
			n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE reason LIKE '%' || $1 || '%'`, p.reason)
			if n != 1 {
				t.Errorf("dead_letters with reason %q: %d rows, want 1", p.reason, n)
			}
		}
		// The dead-letter topic has the same records, with their provenance.
		topicID := e.topicID().String()
		cl := e.client(kgo.ConsumeTopics(e.dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		reasons := map[string]bool{}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		for len(reasons) < len(poison) && ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				h := map[string]string{}
				for _, kv := range r.Headers {
					h[kv.Key] = string(kv.Value)
				}
				if h["topic"] != e.topic || h["partition"] != "0" || h["offset"] == "" || h["topic_id"] != topicID {
					t.Errorf("dead letter %s lacks provenance headers: %v", h["reason"], h)
				}
				reasons[h["reason"]] = true
			})
		}
		for _, p := range poison {
			found := false
			for r := range reasons {
				found = found || strings.Contains(r, p.reason)
			}
			if !found {
				t.Errorf("no record on the dead-letter topic with reason %q (have %v)", p.reason, reasons)
			}
		}
	})
}

// Canceling Run drains: it returns after in-flight batches committed and
// the Kafka offsets match those stored in Postgres; a new member then
// resumes without re-reading anything.
func TestDrainCommitsOffsets(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 3)
		stream, err := orders.Generate(3000, 0, 5)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		cfg := e.config("draining")
		cfg.CommitInterval = time.Hour // only the drain commits
		m := e.start(cfg, slowWriter{e.writer(0), 5 * time.Millisecond, nil})
		e.waitProcessed(300, 60*time.Second)
		m.stop(t)

		adm := kadm.NewClient(e.client())
		committed, err := adm.FetchOffsets(t.Context(), e.group)
		if err != nil {
			t.Fatal(err)
		}
		stored := e.storedOffsets()
		if len(stored) == 0 {
			t.Fatal("nothing stored in sink_offsets after the drain")
		}
		for p, n := range stored {
			got, ok := committed.Lookup(e.topic, p)
			if !ok || got.At != n {
				t.Errorf("partition %d: Kafka committed %v (found %v), Postgres stored %d", p, got.At, ok, n)
			}
		}

		next := e.start(e.config("next"), e.writer(0))
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		next.stop(t)
		e.checkExactlyOnce(stream.Unique)
		if s := next.c.Stats(); s.SkippedPostgres != 0 {
			t.Errorf("the next member re-read %d applied keys, want 0", s.SkippedPostgres)
		}
	})
}

// A backlog is decoded from Kafka about once: a partition paused because
// its queue is full must not have its fetched records dropped (and fetched
// and decompressed again after it resumes) while the worker catches up.
// Here every partition's backlog fits one fetch and is many times the
// queue's high water, so each record should be decoded exactly once.
func TestBacklogIsFetchedOnce(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 4)
		stream, err := orders.Generate(8000, 0, 9)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		m := e.start(e.config("m1"), e.writer(0)) // BatchMaxRecords 100: queues pause at 256
		e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
		s := m.c.Stats()
		if s.RecordsConsumed < int64(len(stream.Messages)) || s.RecordsFetched < s.RecordsConsumed {
			t.Fatalf("consumed %d, fetched %d records of %d: want fetched >= consumed >= records",
				s.RecordsConsumed, s.RecordsFetched, len(stream.Messages))
		}
		if s.RecordsFetched > s.RecordsConsumed*5/4 {
			t.Errorf("decoded %d records from fetches to consume %d (%.1fx): paused partitions' fetched records were dropped and fetched again",
				s.RecordsFetched, s.RecordsConsumed, float64(s.RecordsFetched)/float64(s.RecordsConsumed))
		}
	})
}

// While its worker is stuck, a partition's queue fills to its high water
// and its fetching pauses: the queue holds at most the high water plus
// one fetch share (Stats.QueuedRecords, "Memory" in the package doc), the
// rest of the backlog stays in Kafka, and it is all applied once the
// worker goes on.
func TestStuckWorkerQueueIsBounded(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(5000, 0, 11)
		if err != nil {
			t.Fatal(err)
		}
		// Small producer batches, so a share is not one oversized batch.
		cl := e.client(kgo.DefaultProduceTopic(e.topic), kgo.ProducerBatchMaxBytes(8<<10))
		recs := make([]*kgo.Record, len(stream.Messages))
		for i, m := range stream.Messages {
			recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
		}
		if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		cfg := e.config("m1") // BatchMaxRecords 100: the queue pauses at 256
		cfg.FetchMaxPartitionBytes = 16 << 10
		gate := &gateWriter{Writer: e.writer(0), arrived: make(chan struct{}), gate: make(chan struct{})}
		m := e.start(cfg, gate)
		<-gate.arrived
		// The queue stops growing once paused; wait until it has been
		// still for a second.
		var last processor.Stats
		for still := 0; still < 10; {
			time.Sleep(100 * time.Millisecond)
			s := m.c.Stats()
			if s.QueuedRecords == last.QueuedRecords {
				still++
			} else {
				still = 0
			}
			last = s
		}
		t.Logf("stuck worker: %d records queued (%d value bytes), %d consumed of %d", last.QueuedRecords, last.QueuedBytes, last.RecordsConsumed, len(recs))
		const highWater, share = 256, 600 // a 16 KiB share holds a few hundred of these records
		if last.QueuedRecords < highWater || last.QueuedRecords > highWater+share || last.QueuedBytes <= 0 {
			t.Errorf("stuck worker's queue holds %d records (%d value bytes), want %d..%d",
				last.QueuedRecords, last.QueuedBytes, highWater, highWater+share)
		}
		if last.RecordsConsumed >= int64(len(recs)) {
			t.Errorf("consumed all %d records while the worker was stuck: the partition was not paused", last.RecordsConsumed)
		}
		close(gate.gate)
		e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
		if s := m.c.Stats(); s.QueuedRecords != 0 {
			t.Errorf("%d records still queued after the member stopped", s.QueuedRecords)
		}
	})
}
