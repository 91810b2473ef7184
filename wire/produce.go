package wire

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrStillProducing is the outcome Produce gives a record whose produce had
// not finished when the timeout ran out. The record may still reach the
// topic later.
var ErrStillProducing = errors.New("still producing when the produce timeout ran out")

// Produce produces recs with cl and returns each one's outcome, in the
// order of recs, waiting at most timeout. Unlike kgo.Client.ProduceSync it
// is bounded even when the client keeps retrying a record whose request
// was sent (an idempotent producer does not fail such a record when its
// context ends), and its results follow the records' order, not the order
// of completion. A record not done in time gets ErrStillProducing.
func Produce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, timeout time.Duration) []error {
	return ProduceThen(ctx, cl, recs, timeout, nil)
}

// ProduceThen is Produce, and later calls late(i, err) with the outcome of
// each record recs[i] that it reported as ErrStillProducing, once the
// client settles it: delivered (err nil), or failed. late runs on the
// client's promise goroutine, at most once a record, after ProduceThen has
// returned; it must not block. A nil late is Produce. A record the client
// never settles (it was closed first: the client then fails it) gets no
// call only if the process ends.
func ProduceThen(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, timeout time.Duration, late func(i int, err error)) []error {
	type result struct {
		i   int
		err error
	}
	// Buffered for every record, so that a promise never blocks.
	done := make(chan result, len(recs))
	var (
		mu       sync.Mutex
		returned bool // once set, promises call late instead of sending on done
	)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for i, rec := range recs {
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			mu.Lock()
			if !returned {
				done <- result{i, err}
				mu.Unlock()
				return
			}
			mu.Unlock()
			if late != nil {
				late(i, err)
			}
		})
	}
	outcome := make([]error, len(recs))
	for i := range outcome {
		outcome[i] = ErrStillProducing
	}
	for n := 0; n < len(recs); n++ {
		select {
		case res := <-done:
			outcome[res.i] = res.err
		case <-ctx.Done():
			// What was sent before the flag was set is an outcome now;
			// what settles after it goes to late.
			mu.Lock()
			returned = true
			mu.Unlock()
			for {
				select {
				case res := <-done:
					outcome[res.i] = res.err
				default:
					return outcome
				}
			}
		}
	}
	return outcome
}
