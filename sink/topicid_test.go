package sink_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A topic deleted and recreated under the same name starts its offsets
// again from 0: a poison record of the new topic (id B) at an offset that
// had a dead letter under the old one (id A) is a record of its own. It
// gets its own dead_letters row — written whole, not found whole under
// DeferOffset, not absorbed by the old row — whether it could not be
// decoded or a handler refused it. A dead letter read again under its own
// topic id is recorded already: found whole, no second row. A row whose
// topic id is unknown (NULL: written before dead letters carried one)
// stands for no topic id but NULL, so it shadows no record of a known
// topic.
func TestDeadLettersOfRecreatedTopic(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	w := newWriter(t, pool, schema, nil)
	epoch := take(t, w)
	idA := uuid.NullUUID{UUID: uuid.New(), Valid: true}
	idB := uuid.NullUUID{UUID: uuid.New(), Valid: true}
	rows := func(offset string) int64 {
		return sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE "offset" = `+offset)
	}
	undecodable := func(offset int64) []sink.DeadLetter {
		return []sink.DeadLetter{{Topic: "orders", Partition: 0, Offset: offset, Reason: "not json", Value: []byte("x")}}
	}

	// Topic A: event a at 0, an undecodable record at 1, a refused event at 2.
	a, bad := uuid.New(), uuid.New()
	va := order(1, "A")
	evs := events(0, []uuid.UUID{a}, [][]byte{va})
	if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: -1, NextOffset: 2, TopicID: idA,
		Events: evs, DeadLetters: undecodable(1)}); err != nil {
		t.Fatal(err)
	}
	rejecting := newWriter(t, pool, schema, nil, rejectHandler{bad})
	refused := []sink.Event{{ID: bad, Value: order(9, "Z"), Topic: "orders", Partition: 0, Offset: 2}}
	if res, err := rejecting.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 2, NextOffset: 3, TopicID: idA,
		Events: refused}); err != nil || res.DeadLetters != 1 {
		t.Fatalf("topic A's refused event: %+v, %v; want one dead letter", res, err)
	}

	// Read again under A: recorded already, nothing written.
	res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 3, NextOffset: 2, TopicID: idA, DeferOffset: true,
		Events: evs, DeadLetters: undecodable(1)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OffsetDeferred || rows("1") != 1 {
		t.Errorf("topic A's dead letter read again: %+v, %d rows at offset 1; want found whole, one row", res, rows("1"))
	}

	// The topic recreated: B's records at the same offsets. The new owner
	// starts from B's log start with the offset stored for A as its fence.
	epoch = take(t, w)
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 3, NextOffset: 2, TopicID: idB, DeferOffset: true,
		Events: evs, DeadLetters: undecodable(1)})
	if err != nil {
		t.Fatal(err)
	}
	if res.OffsetDeferred || res.DeadLetters != 1 {
		t.Errorf("topic B's undecodable record at offset 1: %+v; want it written, not found whole", res)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE "offset" = 1 AND topic_id = '`+idB.UUID.String()+`'`); n != 1 {
		t.Errorf("topic B's dead letters at offset 1 = %d, want 1 (beside topic A's)", n)
	}
	bad2 := uuid.New()
	rejecting = newWriter(t, pool, schema, nil, rejectHandler{bad2})
	res, err = rejecting.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 2, NextOffset: 3, TopicID: idB,
		Events: []sink.Event{{ID: bad2, Value: order(8, "Y"), Topic: "orders", Partition: 0, Offset: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if n := rows("2"); res.DeadLetters != 1 || n != 2 {
		t.Errorf("topic B's refused event at offset 2: %+v, %d rows at offset 2; want its own row beside topic A's", res, n)
	}

	// B's records read again: found whole.
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 3, NextOffset: 2, TopicID: idB, DeferOffset: true,
		Events: evs, DeadLetters: undecodable(1)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OffsetDeferred || rows("1") != 2 {
		t.Errorf("topic B's dead letter read again: %+v, %d rows at offset 1; want found whole, two rows", res, rows("1"))
	}

	// A row of an unknown topic id (NULL) at offset 5: it does not stand
	// for B's record at 5, and is found by a re-read whose id is unknown too.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.dead_letters (consumer_group, topic, partition, "offset", reason)
VALUES ('g', 'orders', 0, 5, 'written before topic ids')`); err != nil {
		t.Fatal(err)
	}
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 3, NextOffset: 6, TopicID: idB, DeferOffset: true,
		DeadLetters: undecodable(5)})
	if err != nil {
		t.Fatal(err)
	}
	if res.OffsetDeferred || rows("5") != 2 {
		t.Errorf("topic B's record at offset 5 beside a row of no topic id: %+v, %d rows at offset 5; want it written", res, rows("5"))
	}
	res, err = w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 6, NextOffset: 6, DeferOffset: true,
		DeadLetters: undecodable(5)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OffsetDeferred || rows("5") != 2 {
		t.Errorf("a record of no topic id read again beside a row of none: %+v, %d rows at offset 5; want found whole", res, rows("5"))
	}
	// Written (not deferred) again under B: the conflict absorbs it.
	if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 6, NextOffset: 6, TopicID: idB,
		DeadLetters: undecodable(5)}); err != nil {
		t.Fatal(err)
	}
	if n := rows("5"); n != 2 {
		t.Errorf("dead letters at offset 5 after writing B's again = %d, want 2", n)
	}
}

// rejectHandler refuses one event (sink.RejectError) and applies the rest.
type rejectHandler struct{ id uuid.UUID }

func (rejectHandler) Name() string { return "rejectHandler" }

func (h rejectHandler) Apply(_ context.Context, _ pgx.Tx, events []sink.Event) error {
	for _, e := range events {
		if e.ID == h.id {
			return &sink.RejectError{EventID: e.ID, Reason: "refused"}
		}
	}
	return nil
}
