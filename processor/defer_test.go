package processor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// A replay's re-read defers its offsets: once a partition's batch is found
// whole, the batches behind it that are found whole too write nothing
// (sink.Batch.DeferOffset) — yet each partition's last batch stores its
// offset, so the stored offsets, and Kafka's, end at the log's end. A
// member stopped in the middle of the re-read stores the offsets its
// workers deferred as they exit; one that crashes (Abort) leaves them
// behind, and the next member reads those records again, applies nothing
// twice, and ends at the log's end too.
func TestReplayDefersOffsets(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		const partitions = 3
		e := newEnv(t, b, partitions)
		stream, err := orders.Generate(15000, 0, 11)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		first := e.start(e.config("first"), e.writer(0))
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		first.stop(t)
		ends := e.logEnds()

		var mu sync.Mutex
		var deferred, stored int
		last := map[int32]int64{}        // the NextOffset of each partition's last batch
		lastDeferred := map[int32]bool{} // whether that batch deferred its offset
		var deferredOnce chan struct{}
		var once *sync.Once
		cfg := e.config("rereading")
		cfg.OnBatch = func(bi processor.BatchInfo) {
			mu.Lock()
			defer mu.Unlock()
			last[bi.Partition], lastDeferred[bi.Partition] = bi.NextOffset, bi.Result.OffsetDeferred
			if bi.Result.Applied != 0 {
				t.Errorf("partition %d: the re-read applied %d keys", bi.Partition, bi.Result.Applied)
			}
			if bi.Result.OffsetDeferred {
				deferred++
				once.Do(func() { close(deferredOnce) })
			} else {
				stored++
			}
		}
		// reread rewinds every partition to its start and starts a member
		// that writes a batch each 30 ms (50 a partition), and returns it
		// once one of its batches deferred its offset.
		reread := func() *member {
			t.Helper()
			e.rewind()
			mu.Lock()
			deferred, stored = 0, 0
			clear(last)
			clear(lastDeferred)
			deferredOnce, once = make(chan struct{}), new(sync.Once)
			ch := deferredOnce
			mu.Unlock()
			m := e.start(cfg, slowWriter{e.writer(0), 30 * time.Millisecond, nil})
			select {
			case <-ch:
			case <-time.After(60 * time.Second):
				t.Fatal("no batch of the re-read deferred its offset within 60s")
			}
			return m
		}

		// Stopped: what the workers deferred is stored as they exit.
		m := reread()
		m.stop(t)
		mu.Lock()
		t.Logf("stopped in the re-read: %d batches deferred their offset, %d stored it", deferred, stored)
		endedDeferred := 0
		for p, n := range e.storedOffsets() {
			if lastDeferred[p] {
				endedDeferred++
			}
			if n != last[p] {
				t.Errorf("partition %d: stored offset %d after the stop, want its last batch's %d (deferred: %v)", p, n, last[p], lastDeferred[p])
			}
		}
		if endedDeferred == 0 {
			t.Error("no partition's last batch before the stop deferred its offset: the case was not exercised")
		}
		mu.Unlock()

		// Crashed: what the workers deferred is read again.
		m = reread()
		m.c.Abort()
		m.stop(t)
		mu.Lock()
		t.Logf("aborted in the re-read: %d batches deferred their offset, %d stored it", deferred, stored)
		behind := false
		for p, n := range e.storedOffsets() {
			behind = behind || n < last[p]
		}
		if !behind {
			t.Error("every stored offset is its partition's last batch's after the crash: no deferred offset was left to read again")
		}
		deferred, stored = 0, 0
		mu.Unlock()

		next := e.start(cfg, e.writer(0))
		e.waitStored(ends, 60*time.Second)
		next.stop(t)
		mu.Lock()
		t.Logf("then: %d batches deferred their offset, %d stored it", deferred, stored)
		if deferred == 0 {
			t.Error("no batch of the next member's re-read deferred its offset")
		}
		if s := next.c.Stats(); s.OffsetsDeferred != int64(deferred) {
			t.Errorf("Stats.OffsetsDeferred = %d, want the %d batches OnBatch saw deferred", s.OffsetsDeferred, deferred)
		}
		mu.Unlock()
		e.checkExactlyOnce(stream.Unique)
		committed, err := kadm.NewClient(e.client()).FetchOffsets(t.Context(), e.group)
		if err != nil {
			t.Fatal(err)
		}
		for p, end := range ends {
			if got, ok := committed.Lookup(e.topic, p); !ok || got.At != end {
				t.Errorf("partition %d: Kafka committed %v (found %v), want the log end %d", p, got.At, ok, end)
			}
		}
	})
}

// logEnds returns the end offset of each partition of the topic.
func (e *env) logEnds() map[int32]int64 {
	e.t.Helper()
	listed, err := kadm.NewClient(e.client()).ListEndOffsets(e.t.Context(), e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	return ends
}

// waitStored waits until sink_offsets holds want for every partition,
// failing after timeout with what it holds.
func (e *env) waitStored(want map[int32]int64, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := e.storedOffsets()
		same := len(got) == len(want)
		for p, n := range want {
			same = same && got[p] == n
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("stored offsets %v within %v, want the log ends %v", got, timeout, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lostOutcomeWriter fails the first batch that asked to defer its offset
// but was written in a transaction — after that transaction committed, as
// a COMMIT whose answer is lost does.
type lostOutcomeWriter struct {
	processor.Writer
	mu    sync.Mutex
	fired int
}

func (l *lostOutcomeWriter) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	res, err := l.Writer.Write(ctx, b)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && b.DeferOffset && !res.OffsetDeferred && l.fired == 0 {
		l.fired++
		return sink.Result{}, errors.New("test: the COMMIT's answer was lost")
	}
	return res, err
}

// A re-read that meets new records: the batch that asked to defer but
// had new events to apply commits, its answer is lost, and its retry
// finds every event applied — by itself. The retry must not defer: it
// learns from the offset's compare-and-set that it committed, and the
// partition goes on, not fenced by its own offset.
func TestRetryAfterLostCommitDoesNotDefer(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 3)
		stream, err := orders.Generate(6000, 0, 13)
		if err != nil {
			t.Fatal(err)
		}
		half := len(stream.Messages) / 2
		e.produceMessages(stream.Messages[:half])
		first := e.start(e.config("first"), e.writer(0))
		e.waitStored(e.logEnds(), 60*time.Second)
		first.stop(t)
		e.rewind()
		e.produceMessages(stream.Messages[half:])
		ends := e.logEnds()
		w := &lostOutcomeWriter{Writer: e.writer(0)}
		m := e.start(e.config("rereading"), w)
		e.waitStored(ends, 60*time.Second)
		m.stop(t)
		w.mu.Lock()
		fired := w.fired
		w.mu.Unlock()
		if fired == 0 {
			t.Fatal("no batch of the re-read asked to defer and had new events: the case was not exercised")
		}
		if s := m.c.Stats(); s.Fenced != 0 {
			t.Errorf("%d batches fenced: a retry deferred its offset and left the fence behind its own", s.Fenced)
		}
		e.checkExactlyOnce(stream.Unique)
	})
}

// storedOffsets returns the offset stored in sink_offsets for each
// partition of the group (-1: none).
func (e *env) storedOffsets() map[int32]int64 {
	e.t.Helper()
	got := map[int32]int64{}
	rows, err := e.pool.Query(e.t.Context(), `SELECT partition, coalesce(next_offset, -1) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group)
	if err != nil {
		e.t.Fatal(err)
	}
	var p int32
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { got[p] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return got
}

// stuckAfterDeferWriter fails, every time, each batch of a partition that
// does not ask to defer once some batch of it has deferred; the empty
// batch of a stopping worker goes through.
type stuckAfterDeferWriter struct {
	processor.Writer
	mu         sync.Mutex
	deferredTo map[int32]int64 // the NextOffset of each partition's last deferred batch
	failed     int
}

func (s *stuckAfterDeferWriter) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	s.mu.Lock()
	if len(b.Events) > 0 && !b.DeferOffset && s.deferredTo[b.Partition] > 0 {
		s.failed++
		s.mu.Unlock()
		return sink.Result{}, errors.New("test: Postgres refuses this batch")
	}
	s.mu.Unlock()
	res, err := s.Writer.Write(ctx, b)
	if err == nil && res.OffsetDeferred {
		s.mu.Lock()
		s.deferredTo[b.Partition] = b.NextOffset
		s.mu.Unlock()
	}
	return res, err
}

// A worker told to stop while it waits to retry a batch stores the offset
// the batches before it deferred, and no further: the failing batch is
// the next owner's.
func TestStopWhileRetryingStoresDeferred(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(3000, 0, 14)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		first := e.start(e.config("first"), e.writer(0))
		e.waitStored(e.logEnds(), 60*time.Second)
		first.stop(t)
		e.rewind()
		w := &stuckAfterDeferWriter{Writer: e.writer(0), deferredTo: map[int32]int64{}}
		m := e.start(e.config("rereading"), w)
		deadline := time.Now().Add(60 * time.Second)
		for m.c.Stats().Retrying == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no batch after a deferred one was retried within 60s: the case was not exercised")
			}
			time.Sleep(20 * time.Millisecond)
		}
		m.stop(t)
		w.mu.Lock()
		want := w.deferredTo[0]
		w.mu.Unlock()
		if got := e.storedOffsets()[0]; got != want {
			t.Errorf("stored offset %d after a stop while retrying, want %d, where the deferred batches ended", got, want)
		}
	})
}

// rewind moves every partition of the group back to offset 0 in
// sink_offsets, as a replay does: the next member to take them reads the
// topic again from its start.
func (e *env) rewind() {
	e.t.Helper()
	if _, err := e.pool.Exec(e.t.Context(), `UPDATE `+e.schema+`.sink_offsets SET next_offset = 0 WHERE consumer_group = $1`, e.group); err != nil {
		e.t.Fatal(err)
	}
}
