package sink_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// TestDeferOffset: a batch under DeferOffset that has nothing to write is
// not written — no offset, no transaction — and every other batch under it
// is written whole, offset included: one with a key not claimed yet, one
// whose event comes back with another payload, one with a dead letter not
// recorded yet.
func TestDeferOffset(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	w := newWriter(t, pool, schema, nil) // no cache: a replay's member, which learns nothing from the look-ups
	epoch := take(t, w)
	stored := func() int64 {
		return sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets WHERE consumer_group = 'g' AND topic = 'orders' AND partition = 0`)
	}
	count := func(q string) int64 { return sinktest.Count(t, pool, q) }
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	va, vb, vc := order(1, "A"), order(2, "B"), order(3, "C")
	if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: -1, NextOffset: 2,
		Events: events(0, []uuid.UUID{a, b}, [][]byte{va, vb})}); err != nil {
		t.Fatal(err)
	}
	emails := count(`SELECT count(*) FROM ` + schema + `.emails_sent`)

	// The re-read: a and b again, every key found; nothing is written.
	res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 2, NextOffset: 4, DeferOffset: true,
		Events: events(2, []uuid.UUID{a, b}, [][]byte{va, vb})})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OffsetDeferred || res.SkippedPostgres != 8 || res.Applied != 0 || res.Attempts != 0 {
		t.Errorf("found whole: %+v, want the offset deferred, 8 keys skipped by Postgres, no transaction", res)
	}
	if got := stored(); got != 2 {
		t.Errorf("stored offset after a deferred batch = %d, want 2 (unchanged)", got)
	}

	// The same fence again, and a new event among the found: written whole.
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 2, NextOffset: 7, DeferOffset: true,
		Events: events(4, []uuid.UUID{a, c, b}, [][]byte{va, vc, vb})})
	if err != nil {
		t.Fatal(err)
	}
	if res.OffsetDeferred || res.Applied != 4 || res.SkippedPostgres != 8 || res.Attempts != 1 {
		t.Errorf("one new event: %+v, want 4 keys applied, 8 skipped, the offset stored", res)
	}
	if got := stored(); got != 7 {
		t.Errorf("stored offset = %d, want 7", got)
	}
	if n := count(`SELECT count(*) FROM ` + schema + `.emails_sent`); n != emails+1 {
		t.Errorf("emails_sent rows = %d, want %d: c applied once, a and b not again", n, emails+1)
	}

	// a with another payload: the transaction refuses it as a conflict.
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 7, NextOffset: 9, DeferOffset: true,
		Events: events(7, []uuid.UUID{b, a}, [][]byte{vb, order(1, "Z")})})
	if err != nil {
		t.Fatal(err)
	}
	if res.OffsetDeferred || res.Conflicts != 1 || stored() != 9 {
		t.Errorf("conflicting payload: %+v, stored offset %d; want one conflict, the offset 9 stored", res, stored())
	}
	if n := count(`SELECT count(*) FROM ` + schema + `.dead_letters WHERE reason = '` + sink.ReasonConflict + `'`); n != 1 {
		t.Errorf("conflict dead letters = %d, want 1", n)
	}

	// A record that could not be decoded, among found events: its dead
	// letter is written, with the offset.
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 9, NextOffset: 11, DeferOffset: true,
		Events:      events(9, []uuid.UUID{b}, [][]byte{vb}),
		DeadLetters: []sink.DeadLetter{{Topic: "orders", Partition: 0, Offset: 10, Reason: "not json", Value: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.OffsetDeferred || res.DeadLetters != 1 || stored() != 11 {
		t.Errorf("dead letter: %+v, stored offset %d; want the dead letter and offset 11 stored", res, stored())
	}
	if n := count(`SELECT count(*) FROM ` + schema + `.dead_letters WHERE "offset" = 10`); n != 1 {
		t.Errorf("dead letters at offset 10 = %d, want 1", n)
	}

	// Without DeferOffset, a batch found whole stores its offset.
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 11, NextOffset: 13,
		Events: events(11, []uuid.UUID{a, b}, [][]byte{va, vb})})
	if err != nil {
		t.Fatal(err)
	}
	if res.OffsetDeferred || stored() != 13 {
		t.Errorf("found whole without DeferOffset: %+v, stored offset %d; want 13 stored", res, stored())
	}

	// The record at offset 10 read again, still undecodable, with b: its
	// dead letter is recorded already, so the batch has nothing to write.
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 13, NextOffset: 11, DeferOffset: true,
		Events:      events(9, []uuid.UUID{b}, [][]byte{vb}),
		DeadLetters: []sink.DeadLetter{{Topic: "orders", Partition: 0, Offset: 10, Reason: "not json", Value: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OffsetDeferred || res.DeadLetters != 0 || stored() != 13 {
		t.Errorf("a dead letter recorded already: %+v, stored offset %d; want the offset deferred, nothing written", res, stored())
	}
}

// TestDeferOffsetFromTheCache: a batch under DeferOffset whose keys the
// cache knows committed needs no database at all: it goes through with the
// Writer's pool closed.
func TestDeferOffsetFromTheCache(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	own := sinktest.Pool(t)
	cache, err := dedup.New(100)
	if err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, own, schema, cache)
	epoch := take(t, w)
	a := uuid.New()
	if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: -1, NextOffset: 1,
		Events: events(0, []uuid.UUID{a}, [][]byte{order(1, "A")})}); err != nil {
		t.Fatal(err)
	}
	own.Close()
	res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 1, NextOffset: 2, DeferOffset: true,
		Events: events(1, []uuid.UUID{a}, [][]byte{order(1, "A")})})
	if err != nil {
		t.Fatalf("a batch the cache knows whole, with the pool closed: %v", err)
	}
	if !res.OffsetDeferred || res.SkippedLRU != 4 {
		t.Errorf("%+v, want the offset deferred and 4 keys skipped by the cache", res)
	}
	// Without DeferOffset it needs its transaction, and fails.
	if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 1, NextOffset: 2,
		Events: events(1, []uuid.UUID{a}, [][]byte{order(1, "A")})}); err == nil {
		t.Error("a batch that stores its offset went through a closed pool")
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets WHERE partition = 0`); n != 1 {
		t.Errorf("stored offset = %d, want 1", n)
	}
}
