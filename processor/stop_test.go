package processor_test

import (
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
)

// A member told to stop finishes the batch it is writing and starts no
// other, however many records its workers have queued: what is queued is
// left to the next owner, and a revoke or a shutdown waits for one batch
// per partition, not for the queue.
func TestStopStartsNoBatch(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(3000, 0, 12)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		var mu sync.Mutex
		var stopping bool
		var after int
		written := make(chan struct{}, 1)
		cfg := e.config("stopping")
		cfg.DrainTimeout = 4 * time.Second // longer than the rest of the stream takes
		cfg.OnBatch = func(processor.BatchInfo) {
			mu.Lock()
			defer mu.Unlock()
			if stopping {
				after++
			}
			select {
			case written <- struct{}{}:
			default:
			}
		}
		m := e.start(cfg, slowWriter{e.writer(0), 100 * time.Millisecond, nil}) // 30 batches: 3 s at least
		select {
		case <-written:
		case <-time.After(60 * time.Second):
			t.Fatal("no batch written within 60s")
		}
		time.Sleep(150 * time.Millisecond) // the queue fills up behind the batches
		mu.Lock()
		stopping = true
		mu.Unlock()
		m.stop(t)
		mu.Lock()
		defer mu.Unlock()
		if after > 1 {
			t.Errorf("%d batches committed after the stop, want at most the one in flight", after)
		}
		if n := e.processed(); n >= int64(len(stream.Unique)) {
			t.Errorf("all %d events processed: the stop came too late to tell", n)
		}
	})
}
