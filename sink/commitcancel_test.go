package sink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// cancelingHandler cancels the batch's context as it applies: the
// transaction's COMMIT is not sent yet.
type cancelingHandler struct{ cancel context.CancelFunc }

func (cancelingHandler) Name() string { return "canceling" }

func (h cancelingHandler) Apply(context.Context, pgx.Tx, []sink.Event) error {
	h.cancel()
	return nil
}

// Write's context canceled once COMMIT is sent does not make a committed
// batch look failed: Write waits for COMMIT's answer and returns the
// batch's Result, skips included, as Postgres holds it. (It returned the
// cancel's error, and an aborted member counted nothing of a batch it had
// committed, nor did anyone else: the next owner starts after it.)
// Canceled before COMMIT is sent, the transaction rolls back and Write
// fails.
func TestCancelDuringCommit(t *testing.T) {
	for _, tc := range []struct {
		name         string
		beforeCommit bool // cancel in a handler rather than while COMMIT's answer is held
	}{
		{"canceled while COMMIT's answer is on its way", false},
		{"canceled before COMMIT is sent", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, gate := sinktest.GatedPool(t)
			schema := sinktest.Schema(t, pool, orders.Migrate)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var extra []sink.Handler
			if tc.beforeCommit {
				extra = append(extra, cancelingHandler{cancel})
			}
			cache, _ := dedup.New(100)
			w := newWriter(t, pool, schema, cache, extra...)
			stored := func() int64 {
				return sinktest.Count(t, pool, `SELECT coalesce(next_offset, -1) FROM `+schema+`.sink_offsets WHERE consumer_group = 'g'`)
			}

			a, b := uuid.New(), uuid.New()
			batch := &sink.Batch{Topic: "orders", Partition: 0, Epoch: take(t, w), Fence: -1, NextOffset: 3,
				Events: events(0, []uuid.UUID{a, b, a}, [][]byte{order(1, "A"), order(2, "B"), order(1, "A")})}
			type result struct {
				res sink.Result
				err error
			}
			done := make(chan result, 1)
			gate.Arm()
			go func() {
				res, err := w.Write(ctx, batch)
				done <- result{res, err}
			}()

			var got result
			if tc.beforeCommit {
				got = <-done
				gate.Release()
				if !errors.Is(got.err, context.Canceled) {
					t.Errorf("Write canceled before COMMIT: err = %v, want context.Canceled", got.err)
				}
				if n, emails := stored(), sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent`); n != -1 || emails != 0 {
					t.Errorf("canceled before COMMIT: stored offset %d, %d emails; want -1 and 0 (rolled back)", n, emails)
				}
				return
			}
			select {
			case <-gate.Sent():
			case <-time.After(30 * time.Second):
				t.Fatal("no COMMIT went out within 30s")
			}
			// Postgres commits; its answer waits at the gate.
			for deadline := time.Now().Add(30 * time.Second); stored() != 3; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("stored offset %d 30s after COMMIT went out, want 3", stored())
				}
			}
			cancel()
			// Give a Write that gives the COMMIT up on the cancel time to
			// do so before the answer comes through.
			select {
			case got = <-done:
			case <-time.After(200 * time.Millisecond):
				gate.Release()
				got = <-done
			}
			if got.err != nil {
				t.Fatalf("Write canceled after its COMMIT went through: %v", got.err)
			}
			// Two events applied by four handlers; the third record is a
			// duplicate of the first: four pairs skipped.
			if got.res.Applied != 8 || got.res.SkippedPostgres != 4 || got.res.NextOffset != 3 {
				t.Errorf("Result: applied %d, skipped %d by postgres, next offset %d; want 8, 4, 3",
					got.res.Applied, got.res.SkippedPostgres, got.res.NextOffset)
			}
			if emails := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent`); emails != 2 {
				t.Errorf("%d emails, want 2", emails)
			}
		})
	}
}
