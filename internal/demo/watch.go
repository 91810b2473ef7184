package demo

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/wire"
)

// watch drives a running demo: it replaces a member every RebalanceEvery
// and reports progress until every record is committed.
type watch struct {
	env   Env
	o     Options
	g     *members.Group
	pub   *publishing
	total int64
	start time.Time
}

// run returns nil once every published record is committed, or the reason
// it stopped first.
func (w *watch) run(ctx context.Context) error {
	deadline := time.NewTimer(w.o.Timeout)
	defer deadline.Stop()
	churn := time.NewTicker(w.o.RebalanceEvery)
	defer churn.Stop()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	changes := 0
	for {
		select {
		case <-ctx.Done():
			progress(w.env.Progress, "interrupted")
			return ErrInterrupted
		case <-deadline.C:
			return fmt.Errorf("demo did not finish within --timeout %v", w.o.Timeout)
		case <-churn.C:
			changes++
			// Every third change is a crash: no Kafka commit at all.
			if _, err := w.g.Churn(ctx, changes); err != nil {
				return err
			}
		case <-tick.C:
			done, err := w.report(ctx)
			if err != nil || done {
				return err
			}
		}
	}
}

// report prints one progress line and says whether everything published
// is committed.
func (w *watch) report(ctx context.Context) (bool, error) {
	committed, err := members.Committed(ctx, w.env.Pool, w.o.Schema, w.env.Consumer.Group)
	if err != nil {
		return false, err
	}
	s, c := w.g.Stats(), w.g.Counts()
	progress(w.env.Progress, "[%5.1fs] published %d/%d · committed %d · consumed %d · skipped lru %d, postgres %d · members %d (left %d, crashed %d)",
		time.Since(w.start).Seconds(), w.pub.sent.Load(), w.total, committed, s.RecordsConsumed, s.SkippedLRU, s.SkippedPostgres,
		c.Running, c.Left, c.Crashed)
	select {
	case <-w.pub.done:
		if w.pub.err != nil {
			return false, fmt.Errorf("publish: %w", w.pub.err)
		}
		return committed >= w.total, nil
	default:
		return false, nil
	}
}

// publishing is the demo's producer, running in a goroutine it owns.
type publishing struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned; err is set then
	err    error
	sent   atomic.Int64
}

// startPublishing produces msgs in ten slices, gap apart, then the
// replay, until done or stopped.
func startPublishing(ctx context.Context, brokers []string, topic string, msgs, replay []orders.Message, gap time.Duration, opts []kgo.Opt) *publishing {
	ctx, cancel := context.WithCancel(ctx)
	p := &publishing{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = p.publish(ctx, brokers, topic, msgs, replay, gap, opts)
	}()
	return p
}

// stop ends the producer and waits for its goroutine.
func (p *publishing) stop() {
	p.cancel()
	<-p.done
}

// publishGap spreads the ten slices over four rebalance periods, so that
// at least three membership changes — the third a crash — come while
// records still arrive, however fast the members consume them (a demo
// that ended before its crash showed none).
func publishGap(rebalanceEvery time.Duration) time.Duration {
	return max(150*time.Millisecond, rebalanceEvery*4/10)
}

func (p *publishing) publish(ctx context.Context, brokers []string, topic string, msgs, replay []orders.Message, gap time.Duration, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5 * time.Millisecond)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	send := func(ms []orders.Message) error {
		recs := make([]*kgo.Record, len(ms))
		for i, m := range ms {
			recs[i] = wire.NewRecord(topic, m.ID, m.Value)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return err
		}
		p.sent.Add(int64(len(ms)))
		return nil
	}
	step := max(1, len(msgs)/10)
	for i := 0; i < len(msgs); i += step {
		if err := send(msgs[i:min(i+step, len(msgs))]); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gap):
		}
	}
	return send(replay)
}
