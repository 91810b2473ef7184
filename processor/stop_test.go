package processor_test

import (
	"log/slog"
	"strings"
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

// A Kill or an Abort is what its caller asked for (a benchmark's storm, a
// crash simulated): it says so at Info, with what it left undone, and
// leaves Warn to what went wrong.
func TestKillAndAbortLogAtInfo(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(300, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		for _, stop := range []struct {
			name, says string
			do         func(*processor.Consumer)
		}{
			{"kill", "consumer killed", (*processor.Consumer).Kill},
			{"abort", "consumer aborted", (*processor.Consumer).Abort},
		} {
			logs := &logRecorder{}
			cfg := e.config(stop.name)
			cfg.Logger = slog.New(logs)
			m := e.start(cfg, e.writer(0))
			e.waitProcessed(1, 30*time.Second)
			// Running (the processed count may be the first member's).
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if _, ok := logs.find(slog.LevelInfo, "consumer starting"); ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: the member did not start within 30s", stop.name)
				}
			}
			stop.do(m.c)
			m.stop(t) // waits for Run to return
			if n := logs.count(slog.LevelWarn, stop.says); n != 0 {
				t.Errorf("%s: %q logged %d times at WARN, want INFO", stop.name, stop.says, n)
			}
			if r, ok := logs.find(slog.LevelInfo, stop.says); !ok || !strings.Contains(r["msg"], "no Kafka offset committed") {
				t.Errorf("%s: %q at INFO, saying what it left undone: %v %v", stop.name, stop.says, r, ok)
			}
		}
		// Aborted before Run: Run returns at once, and says so.
		logs := &logRecorder{}
		cfg := e.config("early")
		cfg.Logger = slog.New(logs)
		c, err := processor.New(cfg, e.writer(0))
		if err != nil {
			t.Fatal(err)
		}
		c.Abort()
		if err := c.Run(t.Context()); err != nil {
			t.Errorf("Run after Abort: %v", err)
		}
		if _, ok := logs.find(slog.LevelInfo, "consumer aborted before it started"); !ok {
			t.Error("an Abort before Run: Run said nothing at INFO")
		}
	})
}
