package sink_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// OldestUnpublishedDeadLetter is the age of the writer's group's oldest
// dead letter not yet on the dead-letter topic (another group's does not
// count), and 0 once it is marked published.
func TestOldestUnpublishedDeadLetter(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	w := newWriter(t, pool, schema, nil)
	if age, err := w.OldestUnpublishedDeadLetter(ctx); err != nil || age != 0 {
		t.Fatalf("no dead letters: %v, %v; want 0", age, err)
	}
	epoch := take(t, w)
	if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: -1, NextOffset: 1,
		DeadLetters: []sink.DeadLetter{{Topic: "orders", Partition: 0, Offset: 0, Reason: "not json", Value: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.dead_letters SET created_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	// Another group's older dead letter is that group's business.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.dead_letters (consumer_group, topic, partition, "offset", reason, created_at)
VALUES ('other', 'orders', 0, 0, 'x', now() - interval '5 hours')`); err != nil {
		t.Fatal(err)
	}
	age, err := w.OldestUnpublishedDeadLetter(ctx)
	if err != nil || age < 59*time.Minute || age > 61*time.Minute {
		t.Fatalf("OldestUnpublishedDeadLetter = %v, %v; want an hour", age, err)
	}
	pending, err := w.LeaseDeadLetters(ctx, 10, time.Minute)
	if err != nil || len(pending) != 1 {
		t.Fatalf("LeaseDeadLetters = %v, %v; want one", pending, err)
	}
	if age, err := w.OldestUnpublishedDeadLetter(ctx); err != nil || age < 59*time.Minute {
		t.Errorf("leased, not published: %v, %v; want still an hour", age, err)
	}
	if err := w.MarkDeadLettersPublished(ctx, []int64{pending[0].ID}, []string{""}); err != nil {
		t.Fatal(err)
	}
	if age, err := w.OldestUnpublishedDeadLetter(ctx); err != nil || age != 0 {
		t.Errorf("published: %v, %v; want 0", age, err)
	}
}

// ReleaseDeadLetters ends the lease of rows not yet published: the next
// LeaseDeadLetters returns them again, while a leased row not released is
// not returned and a published row is never returned again.
func TestReleaseDeadLetters(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	w := newWriter(t, pool, schema, nil)
	epoch := take(t, w)
	var dls []sink.DeadLetter
	for o := range int64(3) {
		dls = append(dls, sink.DeadLetter{Topic: "orders", Partition: 0, Offset: o, Reason: "not json", Value: []byte("x")})
	}
	if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: -1, NextOffset: 3, DeadLetters: dls}); err != nil {
		t.Fatal(err)
	}
	pending, err := w.LeaseDeadLetters(ctx, 10, time.Hour)
	if err != nil || len(pending) != 3 {
		t.Fatalf("LeaseDeadLetters = %v, %v; want three", pending, err)
	}
	if err := w.MarkDeadLettersPublished(ctx, []int64{pending[0].ID}, []string{""}); err != nil {
		t.Fatal(err)
	}
	// The published row and one refused copy are released; the third
	// stays leased.
	if err := w.ReleaseDeadLetters(ctx, []int64{pending[0].ID, pending[1].ID}); err != nil {
		t.Fatal(err)
	}
	again, err := w.LeaseDeadLetters(ctx, 10, time.Hour)
	if err != nil || len(again) != 1 || again[0].ID != pending[1].ID {
		t.Fatalf("LeaseDeadLetters after the release = %v, %v; want only the released unpublished row %d", again, err, pending[1].ID)
	}
	if err := w.ReleaseDeadLetters(ctx, nil); err != nil {
		t.Errorf("ReleaseDeadLetters(nil) = %v, want nil", err)
	}
}
