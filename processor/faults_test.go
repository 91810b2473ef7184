package processor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// A dead letter the dead-letter topic refuses (its value is over the
// topic's max.message.bytes) stops nothing: every good record of every
// partition is applied, the poison record is in dead_letters, and its copy
// reaches the dead-letter topic without its value, saying so.
func TestRefusedDeadLetterStopsNothing(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 6)
		dlq := e.topic + ".small-dlq"
		limit := "1024"
		createTopic(t, e.brokers, dlq, 1, map[string]*string{"max.message.bytes": &limit})
		stream, err := orders.Generate(2000, 0, 11)
		if err != nil {
			t.Fatal(err)
		}
		poisonID := uuid.New()
		poison := wire.NewRecord(e.topic, poisonID, []byte(`{"user_id":1,"items":["`+randomText(6000)+`"]}`))
		recs := []*kgo.Record{poison}
		for _, m := range stream.Messages {
			recs = append(recs, wire.NewRecord(e.topic, m.ID, m.Value))
		}
		e.produce(recs...)

		cfg := e.config("refused")
		cfg.DeadLetterTopic = dlq
		m := e.start(cfg, e.writer(0))
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE event_id = $1 AND reason LIKE '%-byte limit%'`, poisonID); n != 1 {
			t.Errorf("dead_letters rows for the oversize record = %d, want 1", n)
		}
		got := e.consumeAll(dlq, 1, 30*time.Second)
		if len(got) != 1 {
			t.Fatalf("dead-letter topic holds %d records, want 1", len(got))
		}
		h := headers(got[0])
		if h["event_id"] != poisonID.String() || len(got[0].Value) != 0 || !strings.Contains(h["value_omitted"], "too large") {
			t.Errorf("dead-letter copy: value %d bytes, headers %v; want the event id, no value and value_omitted saying why", len(got[0].Value), h)
		}
	})
}

// An order that can never apply (an item too long for the inventory
// index: SQLSTATE 54000) becomes a dead letter with the SQLSTATE; the
// orders around it in the same batches apply, and none of its handlers'
// effects remain.
func TestDataErrorIsolated(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(300, 0, 12)
		if err != nil {
			t.Fatal(err)
		}
		long := uuid.New()
		var recs []*kgo.Record
		for i, m := range stream.Messages {
			recs = append(recs, wire.NewRecord(e.topic, m.ID, m.Value))
			if i == 130 {
				recs = append(recs, wire.NewRecord(e.topic, long, []byte(`{"user_id":7,"items":["`+randomText(10000)+`"]}`)))
			}
		}
		e.produce(recs...)
		cfg := e.config("data-error")
		cfg.Decode.MaxBytes = 1 << 20
		m := e.start(cfg, e.writer(0))
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE event_id = $1 AND reason LIKE '%SQLSTATE 54000%'`, long); n != 1 {
			t.Errorf("dead_letters rows with SQLSTATE 54000 for the long order = %d, want 1", n)
		}
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.processed_events WHERE event_id = $1`, long); n != 0 {
			t.Errorf("the long order has %d processed rows, want 0: a dead-lettered event applies nothing", n)
		}
	})
}

// failFirst fails the first Write of each partition with a transient
// error, then behaves.
type failFirst struct {
	processor.Writer
	mu     sync.Mutex
	failed map[int32]bool
	n      atomic.Int32
}

func (f *failFirst) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	f.mu.Lock()
	first := !f.failed[b.Partition]
	if f.failed == nil {
		f.failed = map[int32]bool{}
	}
	f.failed[b.Partition] = true
	f.mu.Unlock()
	if first {
		f.n.Add(1)
		return sink.Result{}, fmt.Errorf("injected: connection lost: %w", io.ErrUnexpectedEOF)
	}
	return f.Writer.Write(ctx, b)
}

// A batch fails, and its partition is revoked (another member joins) or
// the member is stopped while the batch waits to be retried, with more of
// the partition's records in hand: the worker writes nothing further from
// what it holds, so no record is skipped.
func TestAbandonedBatchSkipsNothing(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		stream, err := orders.Generate(2000, 0, 13)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		fw := &failFirst{Writer: e.writer(0)}
		cfg := e.config("failing")
		cfg.RetryBackoff, cfg.MaxRetryBackoff = 20*time.Second, 20*time.Second
		first := e.start(cfg, fw)
		deadline := time.Now().Add(60 * time.Second)
		for fw.n.Load() < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if fw.n.Load() < 2 {
			t.Fatalf("%d partitions failed their first batch within 60s, want 2", fw.n.Load())
		}
		// Both partitions now wait 20s to retry. A second member takes one
		// of them (a revoke during the backoff); then the first member is
		// stopped (its other partition is revoked during the backoff).
		second := e.start(e.config("second"), e.writer(0))
		time.Sleep(3 * time.Second)
		first.stop(t)
		e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
		second.stop(t)
		e.checkExactlyOnce(stream.Unique)
	})
}

// gateWriter blocks its first Write until gate is closed (a nil gate does
// not block), says when it got there, and keeps every write's error.
type gateWriter struct {
	processor.Writer
	once    sync.Once
	arrived chan struct{}
	gate    chan struct{}
	mu      sync.Mutex
	errs    []error
}

func (g *gateWriter) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	g.once.Do(func() {
		close(g.arrived)
		if g.gate != nil {
			select {
			case <-g.gate:
			case <-ctx.Done():
			}
		}
	})
	res, err := g.Writer.Write(ctx, b)
	g.mu.Lock()
	g.errs = append(g.errs, err)
	g.mu.Unlock()
	return res, err
}

func (g *gateWriter) fenced() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, err := range g.errs {
		if errors.Is(err, sink.ErrFenced) {
			n++
		}
	}
	return n
}

// A member stopped (SIGSTOP) with a batch in hand, past the session
// timeout, is a zombie: its partition moves to a new owner. When it
// resumes (SIGCONT), either it learns from the group that it lost the
// partition and aborts the batch, or its write is fenced, whether or not
// the new owner has written yet; either way the zombie writes nothing of
// the fenced epoch, the owner is never fenced, and every effect happens
// once.
func TestStoppedMemberIsFenced(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ownerWrites bool // the owner writes before the zombie resumes
	}{
		{"owner has not written yet", false},
		{"owner wrote first", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 1)
				stream, err := orders.Generate(3000, 0, 14)
				if err != nil {
					t.Fatal(err)
				}
				e.produceMessages(stream.Messages)
				zombie := e.startProcess(400 * time.Millisecond)
				e.waitProcessed(100, 60*time.Second)
				if err := zombie.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				stoppedAt := e.processed()
				ow := &gateWriter{Writer: e.writer(0), arrived: make(chan struct{})}
				if !tc.ownerWrites {
					ow.gate = make(chan struct{})
				}
				owner := e.start(e.config("owner"), ow)
				select {
				case <-ow.arrived: // the owner has taken the partition
				case <-time.After(60 * time.Second):
					t.Fatal("the new owner never started a batch")
				}
				if tc.ownerWrites {
					e.waitProcessed(stoppedAt+100, 60*time.Second)
				}
				if err := zombie.cmd.Process.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				zombie.waitLog(t, `"msg":"partitions lost`, 30*time.Second)
				if ow.gate != nil {
					close(ow.gate)
				}
				e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
				owner.stop(t)
				e.checkExactlyOnce(stream.Unique)
				if n := ow.fenced(); n != 0 {
					t.Errorf("the owner was fenced %d times, want 0", n)
				}
				assertNoWriteAfterFence(t, zombie.log.String())
			})
		})
	}
}

// assertNoWriteAfterFence checks a child member's log: after a batch of an
// epoch was fenced, no batch of that epoch was written.
func assertNoWriteAfterFence(t *testing.T, log string) {
	t.Helper()
	fencedEpochs := map[float64]bool{}
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		epoch, _ := rec["epoch"].(float64)
		switch rec["msg"] {
		case "batch fenced: another member took the partition; this worker stops and writes nothing more":
			fencedEpochs[epoch] = true
		case "test.write":
			if fencedEpochs[epoch] {
				t.Errorf("the zombie wrote a batch of epoch %v after that epoch was fenced: %s", epoch, line)
			}
		}
	}
}

// A zombie that does not know it is one (its heartbeats answered as if it
// were still in the group, as behind a partition that cuts it off from the
// group coordinator only) keeps writing: its first write after the new
// owner took the partition is fenced although the owner has written
// nothing yet, and the fenced worker writes nothing more. kfake only: the
// heartbeats are faked with a control function.
func TestUnawareZombieIsFenced(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	e := newEnv(t, broker{name: "kfake", start: func(t *testing.T, topic string, partitions int32, extra ...string) []string {
		createTopics(t, cluster.ListenAddrs(), partitions, append([]string{topic}, extra...)...)
		return cluster.ListenAddrs()
	}}, 1)
	stream, err := orders.Generate(5000, 0, 18)
	if err != nil {
		t.Fatal(err)
	}
	e.produceMessages(stream.Messages)

	zlog := &logRecorder{}
	zcfg := e.config("zombie")
	zcfg.Logger = slog.New(zlog)
	zw := &epochWriter{Writer: e.writer(0), delay: 300 * time.Millisecond}
	zombie := e.start(zcfg, zw)
	e.waitProcessed(200, 60*time.Second)

	// From now on the coordinator hears nothing from the zombie, which is
	// told its heartbeats are fine.
	var faking atomic.Bool
	faking.Store(true)
	cluster.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		hb := req.(*kmsg.HeartbeatRequest)
		if !faking.Load() || !strings.HasPrefix(hb.MemberID, "zombie-") {
			return nil, nil, false
		}
		resp := hb.ResponseKind().(*kmsg.HeartbeatResponse)
		return resp, nil, true
	})
	ow := &gateWriter{Writer: e.writer(0), arrived: make(chan struct{}), gate: make(chan struct{})}
	owner := e.start(e.config("owner"), ow)
	select {
	case <-ow.arrived: // the owner took the partition and holds its first batch
	case <-time.After(60 * time.Second):
		t.Fatal("the new owner never started a batch")
	}
	deadline := time.Now().Add(30 * time.Second)
	for zombie.c.Stats().Fenced == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	faking.Store(false) // the zombie learns it left the group
	if zombie.c.Stats().Fenced == 0 {
		t.Fatal("the zombie's writes were not fenced after the new owner took the partition")
	}
	if _, ok := zlog.find(slog.LevelWarn, "batch fenced"); !ok {
		t.Error("the zombie logged no fenced batch")
	}
	close(ow.gate)
	e.waitProcessed(int64(len(stream.Unique)), 90*time.Second)
	owner.stop(t)
	zombie.stop(t)
	e.checkExactlyOnce(stream.Unique)
	if n := ow.fenced(); n != 0 {
		t.Errorf("the owner was fenced %d times, want 0", n)
	}
	zw.assertNothingAfterFence(t)
}

// epochWriter delays every write and keeps each write's epoch and
// outcome.
type epochWriter struct {
	processor.Writer
	delay  time.Duration
	mu     sync.Mutex
	epochs []int64
	errs   []error
}

func (w *epochWriter) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	time.Sleep(w.delay)
	res, err := w.Writer.Write(ctx, b)
	w.mu.Lock()
	w.epochs, w.errs = append(w.epochs, b.Epoch), append(w.errs, err)
	w.mu.Unlock()
	return res, err
}

// assertNothingAfterFence checks that no write of an epoch followed that
// epoch's fenced write.
func (w *epochWriter) assertNothingAfterFence(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	fenced := map[int64]bool{}
	for i, err := range w.errs {
		if fenced[w.epochs[i]] {
			t.Errorf("write %d of epoch %d came after that epoch was fenced (err %v)", i, w.epochs[i], err)
		}
		if errors.Is(err, sink.ErrFenced) {
			fenced[w.epochs[i]] = true
		}
	}
}

// When Kafka's committed offsets are ahead of those stored in Postgres
// (Postgres restored to an earlier point), consumption starts from
// Postgres: the events in between are applied again, once.
func TestPostgresOffsetWinsOverKafka(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		stream, err := orders.Generate(500, 0, 15)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		m := e.start(e.config("before-restore"), e.writer(0))
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		m.stop(t) // drains: Kafka's committed offsets are at the end
		// "Restore" Postgres to before anything was applied.
		for _, table := range []string{"processed_events", "emails_sent", "inventory_reserved", "analytics_counters", "recommender_weights"} {
			if _, err := e.pool.Exec(t.Context(), `TRUNCATE `+e.schema+`.`+table); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.pool.Exec(t.Context(), `UPDATE `+e.schema+`.sink_offsets SET next_offset = 0`); err != nil {
			t.Fatal(err)
		}
		m2 := e.start(e.config("after-restore"), e.writer(0))
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		m2.stop(t)
		e.checkExactlyOnce(stream.Unique)
	})
}

// A stored offset outside the partition's log (below its start: records
// deleted by retention; beyond its end: the topic was recreated) is
// reported as an error naming the topic, the partition and both offsets,
// and consumption goes on from the log start (the default choice).
func TestStoredOffsetOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name             string
		stored, deleteTo int64
		wantApplied      int
		want             string
	}{
		{"below log start", 50, 200, 100, "below the log start"},
		{"beyond log end", 1000, 0, 300, "beyond the log end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 1)
				e.storedOutOfRange(tc.deleteTo, tc.stored)
				logs := &logRecorder{}
				cfg := e.config("out-of-range")
				cfg.Logger = slog.New(logs)
				m := e.start(cfg, e.writer(0))
				e.waitProcessed(int64(tc.wantApplied), 60*time.Second)
				m.stop(t)
				rec, ok := logs.find(slog.LevelError, tc.want)
				if !ok {
					t.Fatalf("no error logged containing %q; logged: %v", tc.want, logs.messages())
				}
				for k, v := range map[string]string{"topic": e.topic, "partition": "0", "stored_offset": fmt.Sprint(tc.stored)} {
					if rec[k] != v {
						t.Errorf("error line %q: %s = %q, want %q", tc.want, k, rec[k], v)
					}
				}
				if got := e.processed(); got != int64(tc.wantApplied) {
					t.Errorf("applied %d events, want %d", got, tc.wantApplied)
				}
			})
		})
	}
}

// storedOutOfRange produces 300 orders to partition 0, deletes its
// records below deleteTo (none when 0), and stores offset stored for it in
// Postgres.
func (e *env) storedOutOfRange(deleteTo, stored int64) {
	e.t.Helper()
	stream, err := orders.Generate(300, 0, 16)
	if err != nil {
		e.t.Fatal(err)
	}
	e.produceMessages(stream.Messages)
	if deleteTo > 0 {
		var o kadm.Offsets
		o.Add(kadm.Offset{Topic: e.topic, Partition: 0, At: deleteTo})
		resp, err := kadm.NewClient(e.client()).DeleteRecords(e.t.Context(), o)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			e.t.Fatalf("delete records: %v", err)
		}
	}
	if _, err := e.pool.Exec(e.t.Context(), `INSERT INTO `+e.schema+`.sink_offsets (consumer_group, topic, partition, next_offset)
VALUES ($1, $2, 0, $3)`, e.group, e.topic, stored); err != nil {
		e.t.Fatal(err)
	}
}

// startPaused stores offset 50 for partition 0, whose records below 200
// are deleted (storedOutOfRange), and starts a member under
// PauseOnOutOfRange, logging to the recorder it returns.
func (e *env) startPaused() (*member, *logRecorder) {
	e.storedOutOfRange(200, 50)
	logs := &logRecorder{}
	cfg := e.config("paused")
	cfg.Logger = slog.New(logs)
	cfg.OffsetOutOfRange = processor.PauseOnOutOfRange
	return e.start(cfg, e.writer(0)), logs
}

// recreateTopic deletes e's topic and creates it again with one
// partition, trying again while the deletion completes (asynchronously).
func (e *env) recreateTopic() {
	e.t.Helper()
	adm := kadm.NewClient(e.client())
	if _, err := adm.DeleteTopic(e.t.Context(), e.topic); err != nil {
		e.t.Fatalf("delete topic: %v", err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := adm.CreateTopic(e.t.Context(), 1, 1, nil, e.topic)
		if err == nil {
			err = resp.Err
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("recreate topic: %v", err)
		}
	}
}

// A partition whose stored offset is out of range stays paused under
// PauseOnOutOfRange, and its lag is its whole log, as it grows, for as
// long as it does (OnceflowPartitionPaused sees it), where it had no lag
// at all.
func TestPausedOutOfRangeHasLag(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		m, logs := e.startPaused()
		waitLogged(t, logs, slog.LevelError, "the partition stays paused", 60*time.Second)
		lag := m.c.Lag()
		if len(lag) != 1 || lag[0].Partition != 0 || lag[0].Lag != 100 {
			t.Errorf("lag of the paused partition: %+v, want partition 0 at 100 (its log: offsets 200 to 300)", lag)
		}
		// Its log grows, and so does its lag, though nothing fetches it.
		more, err := orders.Generate(50, 0, 17)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(more.Messages)
		waitLag(t, m, 150, "of the paused partition after 50 more records", nil)
		if got := e.processed(); got != 0 {
			t.Errorf("applied %d events from a paused partition", got)
		}
		m.stop(t)
	})
}

// A member whose partitions are all paused (their stored offsets out of
// range) fetches nothing, so its client hears of the topic recreated under
// the same name only at its next metadata refresh (MetadataMaxAge, 5
// minutes by default): the member's own look at the topics every few
// seconds sees the new topic id, and the topic is re-added and found again
// within seconds — here the stored offset, beyond the new log's end, is a
// new finding, the partition staying paused.
func TestPausedTopicRecreatedIsFoundAgain(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		m, logs := e.startPaused()
		waitLogged(t, logs, slog.LevelError, "below the log start", 60*time.Second)

		e.recreateTopic()
		recreated := time.Now()
		more, err := orders.Generate(30, 0, 19)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(more.Messages)
		waitLogged(t, logs, slog.LevelError, "beyond the log end", 30*time.Second)
		t.Logf("the recreation found again %v after it", time.Since(recreated).Round(time.Millisecond))
		if got := m.c.Stats().OffsetsOutOfRange; got != 2 {
			t.Errorf("out-of-range findings: %d, want 2 (the old log's start, the new log's end)", got)
		}
		if got := e.processed(); got != 0 {
			t.Errorf("applied %d events from a paused partition", got)
		}
		m.stop(t)
	})
}

// A topic deleted and recreated under the same name, whose new log has
// grown past the offset stored for the old one, is detected by its topic
// id: consumption starts at the new log's start (the policy's default),
// not at the old offset, so no record of the new topic is skipped.
func TestRecreatedTopicIsDetected(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		first, err := orders.Generate(100, 0, 17)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(first.Messages)
		m := e.start(e.config("before"), e.writer(0))
		e.waitProcessed(100, 60*time.Second)
		m.stop(t)

		e.recreateTopic()
		second, err := orders.Generate(300, 0, 18)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(second.Messages)

		logs := &logRecorder{}
		cfg := e.config("after")
		cfg.Logger = slog.New(logs)
		m = e.start(cfg, e.writer(0))
		e.waitProcessed(400, 60*time.Second)
		m.stop(t)
		if _, ok := logs.find(slog.LevelError, "recreated under the same name"); !ok {
			t.Errorf("no error logged about the recreated topic; logged: %v", logs.messages())
		}
		if got := e.processed(); got != 400 {
			t.Errorf("applied %d events, want 400", got)
		}
	})
}

// A drain is bounded: with a batch blocked in Postgres (a lock held
// elsewhere), canceling Run returns within DrainTimeout, having committed
// nothing of the blocked batch; and Abort during a long drain ends it at
// once.
func TestDrainIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drain time.Duration
		abort bool
	}{
		{"drain timeout", time.Second, false},
		{"abort during drain", 10 * time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 1)
				stream, err := orders.Generate(200, 0, 17)
				if err != nil {
					t.Fatal(err)
				}
				e.produceMessages(stream.Messages)
				lock, err := e.pool.Begin(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				defer lock.Rollback(context.Background()) //nolint:errcheck
				if _, err := lock.Exec(t.Context(), `LOCK TABLE `+e.schema+`.emails_sent IN ACCESS EXCLUSIVE MODE`); err != nil {
					t.Fatal(err)
				}
				hs, err := orders.Handlers(e.schema)
				if err != nil {
					t.Fatal(err)
				}
				w, err := sink.New(e.pool, sink.Config{Schema: e.schema, Group: e.group, Handlers: hs, TxTimeout: 10 * time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				cfg := e.config("blocked")
				cfg.DrainTimeout = tc.drain
				cfg.RebalanceTimeout = max(cfg.RebalanceTimeout, tc.drain+time.Second)
				m := e.start(cfg, w)
				e.waitBlockedBy(lock, 60*time.Second)
				m.cancel()
				if tc.abort {
					time.Sleep(500 * time.Millisecond)
					m.c.Abort()
				}
				select {
				case err := <-m.done:
					if err != nil {
						t.Errorf("Run: %v", err)
					}
				case <-time.After(60 * time.Second):
					t.Fatal("Run did not return within 60s while a batch was blocked")
				}
				m.once.Do(func() {}) // already stopped
				if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.processed_events`); n != 0 {
					t.Errorf("%d processed rows after the blocked batch was abandoned, want 0", n)
				}
			})
		})
	}
}

// waitBlockedBy waits until a backend waits for a lock the transaction
// holder holds: only its waiters count, not the lock waits of other tests
// sharing the database.
func (e *env) waitBlockedBy(holder pgx.Tx, timeout time.Duration) {
	e.t.Helper()
	var pid uint32
	if err := holder.QueryRow(e.t.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		if sinktest.Count(e.t, e.pool, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE %d = ANY(pg_blocking_pids(pid))`, pid)) > 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no backend waits for the held lock after %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consumeAll reads topic from the start until it has want records or
// timeout passes.
func (e *env) consumeAll(topic string, want int, timeout time.Duration) []*kgo.Record {
	cl := e.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(e.t.Context(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

func headers(r *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	return h
}

// logRecorder is a slog.Handler that keeps every record, attributes
// flattened to strings.
type logRecorder struct {
	mu   sync.Mutex
	recs []map[string]string
	lvls []slog.Level
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.lvls = append(l.lvls, r.Level)
	l.mu.Unlock()
	return nil
}

// find returns the first record at level whose message contains s.
func (l *logRecorder) find(level slog.Level, s string) (map[string]string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range l.recs {
		if l.lvls[i] == level && strings.Contains(r["msg"], s) {
			return r, true
		}
	}
	return nil, false
}

// count returns how many records at level have a message containing s.
func (l *logRecorder) count(level slog.Level, s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i, r := range l.recs {
		if l.lvls[i] == level && strings.Contains(r["msg"], s) {
			n++
		}
	}
	return n
}

func (l *logRecorder) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for i, r := range l.recs {
		out = append(out, l.lvls[i].String()+" "+r["msg"])
	}
	return out
}

// randomText returns n random lower-case letters: text that neither
// compression nor TOAST makes small.
func randomText(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(rand.IntN(26))
	}
	return string(b)
}

// problems returns how many records at level WARN or above it holds.
func (l *logRecorder) problems() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, lvl := range l.lvls {
		if lvl >= slog.LevelWarn {
			n++
		}
	}
	return n
}

// The log start passing a member's fetch offset while it works — records
// deleted (retention, DeleteRecords) before it fetched them — is a finding
// as a stored offset out of range is: an error naming the partition and
// both offsets, counted, and kafka.offset_out_of_range followed: earliest
// goes on from the log start; pause writes what was fetched before and
// leaves the partition paused, its lag its whole log, until its offsets
// are reset. The member's Kafka client used to move to the log start with
// only its own warning, whatever the policy.
func TestLogStartPassesTheFetchOffset(t *testing.T) {
	for _, policy := range []processor.OutOfRange{processor.ResumeAtLogStart, processor.PauseOnOutOfRange} {
		t.Run(string(policy), func(t *testing.T) {
			eachBroker(t, func(t *testing.T, b broker) {
				e := newEnv(t, b, 1)
				logs := &logRecorder{}
				cfg := e.config(string(policy))
				cfg.Logger = slog.New(logs)
				cfg.OffsetOutOfRange = policy
				m, lock := e.startBehind(cfg)
				var o kadm.Offsets
				o.Add(kadm.Offset{Topic: e.topic, Partition: 0, At: 3000})
				resp, err := kadm.NewClient(e.client()).DeleteRecords(t.Context(), o)
				if err == nil {
					err = resp.Error()
				}
				if err != nil {
					t.Fatalf("delete records: %v", err)
				}
				more, err := orders.Generate(50, 0, 22)
				if err != nil {
					t.Fatal(err)
				}
				e.produceMessages(more.Messages)
				if err := lock.Rollback(t.Context()); err != nil {
					t.Fatal(err)
				}

				rec := waitLogged(t, logs, slog.LevelError, "fetch offset is below the log start", 60*time.Second)
				at, err := strconv.ParseInt(rec["fetch_offset"], 10, 64)
				if err != nil || at <= 0 || at >= 3000 || rec["log_start"] != "3000" || rec["partition"] != "0" {
					t.Fatalf("the finding's line: %v; want the fetch offset below 3000, the log start 3000, partition 0", rec)
				}
				if got := m.c.Stats().OffsetsOutOfRange; got != 1 {
					t.Errorf("out-of-range findings: %d, want 1", got)
				}
				if policy == processor.ResumeAtLogStart {
					e.waitProcessed(at+50, 60*time.Second)
				} else {
					waitLag(t, m, 50, "after the finding, the partition paused with no worker",
						func() bool { return m.c.Stats().Workers == 0 })
					time.Sleep(time.Second) // nothing more is written
				}
				m.stop(t)
				want := at // what was fetched before the deletion, written
				if policy == processor.ResumeAtLogStart {
					want += 50
				}
				if got := e.processed(); got != want {
					t.Errorf("applied %d events, want %d (offsets below %d, fetched before the deletion%s)", got, want, at,
						map[bool]string{true: ", and the 50 after it", false: ""}[policy == processor.ResumeAtLogStart])
				}
			})
		})
	}
}

// startBehind produces 3000 orders to partition 0 in small record batches,
// then starts a member with cfg (its fetches of 4 KiB) whose first batch
// waits for a lock on emails_sent held by the transaction it returns,
// once its queue is full and its fetching paused, far behind the end
// (about 400 records fetched). Rolling the transaction back lets it go on.
func (e *env) startBehind(cfg processor.Config) (*member, pgx.Tx) {
	e.t.Helper()
	first, err := orders.Generate(3000, 0, 21)
	if err != nil {
		e.t.Fatal(err)
	}
	small := e.client(kgo.DefaultProduceTopic(e.topic), kgo.ProducerBatchMaxBytes(2<<10))
	recs := make([]*kgo.Record, len(first.Messages))
	for i, m := range first.Messages {
		recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
	}
	if err := small.ProduceSync(e.t.Context(), recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
	lock, err := e.pool.Begin(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
	if _, err := lock.Exec(e.t.Context(), `LOCK TABLE `+e.schema+`.emails_sent IN ACCESS EXCLUSIVE MODE`); err != nil {
		e.t.Fatal(err)
	}
	cfg.FetchMaxPartitionBytes = 4 << 10
	m := e.start(cfg, e.writer(0))
	e.waitBlockedBy(lock, 60*time.Second)
	for last, stable := int64(-1), 0; stable < 5; time.Sleep(200 * time.Millisecond) {
		if q := m.c.Stats().QueuedRecords; q == last && q > 0 {
			stable++
		} else {
			last, stable = q, 0
		}
	}
	if q := m.c.Stats().QueuedRecords; q >= 3000 {
		e.t.Fatalf("the member queued all %d records: its fetches were to stop far behind", q)
	}
	return m, lock
}

// A partition's lag counts what its log holds beyond the worker's next
// offset, also while its fetching is paused because its worker's queue is
// full (a slow database): the log's end is read again every few seconds,
// where it was the high watermark of the last fetch, stale for as long
// as the worker took to work through its queue (bb13: 9 420 shown, 29 420
// unread).
func TestLagWhileTheQueueIsFull(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		m, _ := e.startBehind(e.config("behind"))
		more, err := orders.Generate(1000, 0, 23)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(more.Messages)
		waitLag(t, m, 4000, "after the log grew to 4000 records, none written", nil)
		m.stop(t)
	})
}

// A group that Postgres stores no offset for, whose committed offset in
// Kafka is below the log start (another consumer's, or one from before
// this schema), starts from the log start under either policy: the policy
// is for offsets Postgres stores, and the replay tools move only those.
// Under pause the partition stayed paused for ever, out of any reset's
// reach.
func TestKafkaCommittedOffsetBelowTheLogStart(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(300, 0, 24)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		adm := kadm.NewClient(e.client())
		var o kadm.Offsets
		o.Add(kadm.Offset{Topic: e.topic, Partition: 0, At: 200})
		resp, err := adm.DeleteRecords(t.Context(), o)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatalf("delete records: %v", err)
		}
		var c kadm.Offsets
		c.Add(kadm.Offset{Topic: e.topic, Partition: 0, At: 100, LeaderEpoch: -1})
		committed, err := adm.CommitOffsets(t.Context(), e.group, c)
		if err == nil {
			err = committed.Error()
		}
		if err != nil {
			t.Fatalf("commit offset 100 for the group: %v", err)
		}
		logs := &logRecorder{}
		cfg := e.config("kafka-committed")
		cfg.Logger = slog.New(logs)
		cfg.OffsetOutOfRange = processor.PauseOnOutOfRange
		m := e.start(cfg, e.writer(0))
		e.waitProcessed(100, 60*time.Second)
		m.stop(t)
		if _, ok := logs.find(slog.LevelError, "Postgres stores no offset for the partition"); !ok {
			t.Errorf("no error logged about the group's committed offset out of range; logged: %v", logs.messages())
		}
		if got := e.processed(); got != 100 {
			t.Errorf("applied %d events, want 100 (offsets 200 to 300)", got)
		}
	})
}

// waitLag waits up to 30s until m's one partition has lag want (and cond,
// when not nil, holds), failing with what otherwise.
func waitLag(t *testing.T, m *member, want int64, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lag := m.c.Lag()
		if len(lag) == 1 && lag[0].Lag == want && (cond == nil || cond()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag %s: %+v (%d workers) after 30s; want one partition at %d", what, lag, m.c.Stats().Workers, want)
		}
	}
}
