package wire

import (
	"context"
	"errors"
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
	type result struct {
		i   int
		err error
	}
	// Buffered for every record, so that a promise the client calls after
	// Produce has returned never blocks.
	done := make(chan result, len(recs))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for i, rec := range recs {
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { done <- result{i, err} })
	}
	outcome := make([]error, len(recs))
	for i := range outcome {
		outcome[i] = ErrStillProducing
	}
	for range recs {
		select {
		case res := <-done:
			outcome[res.i] = res.err
		case <-ctx.Done():
			return outcome
		}
	}
	return outcome
}
