package processor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// produceTo publishes msgs to partition p, in order, and returns the
// records as the producer stamped them (their timestamps included).
func (e *env) produceTo(p int32, msgs []orders.Message) []*kgo.Record {
	e.t.Helper()
	cl := e.client(kgo.DefaultProduceTopic(e.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
		recs[i].Partition = p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce to partition %d: %v", p, err)
	}
	return recs
}

// genMessages is n unique orders, the same for the same seed.
func genMessages(t *testing.T, n int, seed uint64) []orders.Message {
	t.Helper()
	s, err := orders.Generate(n, 0, seed)
	if err != nil {
		t.Fatal(err)
	}
	return s.Messages
}

// partitionState waits until cond holds for partition p's state, failing
// after a minute with the last state seen.
func partitionState(t *testing.T, c *processor.Consumer, p int32, what string, cond func(processor.PartitionState) bool) processor.PartitionState {
	t.Helper()
	var last processor.PartitionState
	seen := false
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range c.Partitions() {
			if s.Partition == p {
				last, seen = s, true
				if cond(s) {
					return s
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("partition %d: %s not seen within 60s; last state %+v (reported: %v)", p, what, last, seen)
	return last
}

// A partition whose batch is blocked in its handler is stalled: its
// committed offset stands still and its time lag is the age of its first
// unapplied record, while the member's other partition applies its records
// and reports 0; once released, both are caught up at 0. These are the
// series the stall and time-lag alerts read.
func TestPartitionsShowStallAndTimeLag(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		g := &partitionGate{Writer: e.writer(1000), partition: 0, arrived: make(chan struct{}), gate: make(chan struct{})}
		m := e.start(e.config("stall"), g)

		// Both partitions are reported, at 0, before any record.
		for _, p := range []int32{0, 1} {
			partitionState(t, m.c, p, "caught up before any record", func(s processor.PartitionState) bool {
				return s.TimeLag(time.Now()) == 0 && s.Oldest.IsZero() && !s.Retrying
			})
		}

		first := e.produceTo(0, genMessages(t, 5, 321))
		select {
		case <-g.arrived:
		case <-time.After(60 * time.Second):
			t.Fatal("no batch reached the writer within 60s")
		}
		blocked := partitionState(t, m.c, 0, "its blocked batch's first record as the oldest", func(s processor.PartitionState) bool {
			return !s.Oldest.IsZero()
		})
		if got, want := blocked.Oldest.UnixMilli(), first[0].Timestamp.UnixMilli(); got != want {
			t.Errorf("blocked partition's oldest unapplied record is at %d ms, want the first record's %d ms", got, want)
		}
		if blocked.CommittedOffset != 0 {
			t.Errorf("blocked partition's committed offset = %d, want 0 (nothing applied)", blocked.CommittedOffset)
		}
		if lag := blocked.TimeLag(first[0].Timestamp.Add(time.Minute)); lag < time.Minute-time.Millisecond {
			t.Errorf("time lag a minute after the first record = %v, want about a minute", lag)
		}

		// The other partition moves on meanwhile, and reports 0 once caught up.
		e.produceTo(1, genMessages(t, 5, 322))
		partitionState(t, m.c, 1, "committed offset 5 and caught up", func(s processor.PartitionState) bool {
			return s.CommittedOffset == 5 && s.TimeLag(time.Now()) == 0
		})
		still := partitionState(t, m.c, 0, "still blocked", func(processor.PartitionState) bool { return true })
		if still.CommittedOffset != 0 || !still.Oldest.Equal(blocked.Oldest) {
			t.Errorf("blocked partition moved while blocked: %+v, was %+v", still, blocked)
		}

		close(g.gate)
		partitionState(t, m.c, 0, "committed offset 5 and caught up once released", func(s processor.PartitionState) bool {
			return s.CommittedOffset == 5 && s.Oldest.IsZero() && s.TimeLag(time.Now()) == 0
		})
	})
}

// partitionGate blocks the writes of one partition's batches until gate
// is closed, and says when the first got there; other partitions' writes
// pass.
type partitionGate struct {
	processor.Writer
	partition int32
	once      sync.Once
	arrived   chan struct{}
	gate      chan struct{}
}

func (g *partitionGate) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	if b.Partition == g.partition && len(b.Events) > 0 {
		g.once.Do(func() { close(g.arrived) })
		select {
		case <-g.gate:
		case <-ctx.Done():
			return sink.Result{}, ctx.Err()
		}
	}
	return g.Writer.Write(ctx, b)
}

// failWriter fails every write with an error that is retried while failing
// is set.
type failWriter struct {
	processor.Writer
	failing atomic.Bool
	tried   atomic.Int64
}

func (f *failWriter) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	if f.failing.Load() && len(b.Events) > 0 {
		f.tried.Add(1)
		return sink.Result{}, errors.New("postgres is away")
	}
	return f.Writer.Write(ctx, b)
}

// A partition whose batch keeps failing reports Retrying, its committed
// offset standing still, until a retry commits.
func TestPartitionsShowRetrying(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		f := &failWriter{Writer: e.writer(1000)}
		f.failing.Store(true)
		m := e.start(e.config("retrying"), f)
		e.produceTo(0, genMessages(t, 3, 323))
		s := partitionState(t, m.c, 0, "retrying", func(s processor.PartitionState) bool { return s.Retrying })
		if s.CommittedOffset != 0 || s.Oldest.IsZero() {
			t.Errorf("retrying partition: committed offset %d (want 0), oldest %v (want its first record's)", s.CommittedOffset, s.Oldest)
		}
		f.failing.Store(false)
		partitionState(t, m.c, 0, "retry committed", func(s processor.PartitionState) bool {
			return !s.Retrying && s.CommittedOffset == 3 && s.TimeLag(time.Now()) == 0
		})
	})
}
