package processor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// A batch whose transaction times out is written again in smaller
// batches; its partition is retrying (PartitionState.Retrying, the
// onceflow_partition_retrying gauge) from the first timeout until its
// records commit, the attempts of the smaller batches included, not only
// while a backoff is slept, and no longer once they committed.
func TestRetryingWhileTimedOutBatchIsSplit(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(8, 0, 33)
		if err != nil {
			t.Fatal(err)
		}
		w := &timeoutWriter{Writer: e.writer(100)}
		cfg := e.config("retrying")
		cfg.BatchLinger = time.Second // the 8 records in one batch
		m := e.start(cfg, w)
		w.c.Store(m.c)
		e.produceMessages(stream.Messages)
		e.waitProcessed(8, 60*time.Second)
		e.checkExactlyOnce(stream.Unique)

		w.mu.Lock()
		defer w.mu.Unlock()
		if w.timeouts == 0 {
			t.Fatal("no batch of more than one record was written: nothing timed out")
		}
		if len(w.seen) == 0 {
			t.Fatal("no write followed a timeout")
		}
		for i, s := range w.seen {
			if !s.retrying {
				t.Errorf("write %d after a timeout (%d events): Partitions() says Retrying=false, want true while the timed-out records are written again", i, s.events)
			}
		}
		if p := m.c.Partitions(); len(p) != 1 || p[0].Retrying {
			t.Errorf("Partitions() = %+v once every record committed, want one partition not retrying", p)
		}
	})
}

// timeoutWriter fails every batch of more than one event with a timeout,
// as a transaction that ran out of time would, and records, for each
// write that follows a timeout until a batch commits, whether the
// partition was said to be retrying then.
type timeoutWriter struct {
	processor.Writer
	c        atomic.Pointer[processor.Consumer]
	mu       sync.Mutex
	pending  bool // a timeout not yet followed by a committed batch
	timeouts int
	seen     []seenState
}

type seenState struct {
	events   int
	retrying bool
}

func (w *timeoutWriter) Write(ctx context.Context, b *sink.Batch) (sink.Result, error) {
	w.mu.Lock()
	if w.pending {
		retrying := false
		if c := w.c.Load(); c != nil {
			for _, p := range c.Partitions() {
				retrying = retrying || p.Retrying
			}
		}
		w.seen = append(w.seen, seenState{events: len(b.Events), retrying: retrying})
	}
	if len(b.Events) > 1 {
		w.pending = true
		w.timeouts++
		w.mu.Unlock()
		return sink.Result{}, fmt.Errorf("injected: transaction ran out of time: %w", context.DeadlineExceeded)
	}
	w.mu.Unlock()
	res, err := w.Writer.Write(ctx, b)
	if err == nil {
		w.mu.Lock()
		w.pending = false
		w.mu.Unlock()
	}
	return res, err
}
