package sink

import (
	"context"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
)

// ReasonConflict is the dead-letter reason of a conflicting duplicate: an
// event whose id was already applied (or claimed earlier in its batch)
// with a different payload. The first version's effects stand; the second
// applies nothing, for any handler.
const ReasonConflict = "event_id reused with a different payload"

// conflicts returns the events (indexes into the batch's events) that
// conflict: a key of theirs was already claimed (not won) with a stored
// digest that differs from the one it carries now.
func conflicts(keys []pending, won []bool, stored []dedup.Digest) map[int]bool {
	var conflicting map[int]bool
	for i, p := range keys {
		if !won[i] && stored[i].Conflicts(p.digest) {
			if conflicting == nil {
				conflicting = map[int]bool{}
			}
			conflicting[p.event] = true
		}
	}
	return conflicting
}

// refuse takes back the claims that the events refused in tx made (the
// conflicting ones, and those Parse rejected) and returns their dead
// letters, in event order.
func (w *Writer) refuse(ctx context.Context, tx pgx.Tx, b *Batch, keys []pending, won []bool, conflicting map[int]bool, rejected map[int]error) ([]DeadLetter, error) {
	var undo []dedup.Key
	for i, p := range keys {
		if won[i] && (conflicting[p.event] || rejected[p.event] != nil) {
			undo = append(undo, p.key)
		}
	}
	if err := dedup.Unclaim(ctx, tx, w.processed, undo); err != nil {
		return nil, err
	}
	events := make([]int, 0, len(conflicting)+len(rejected))
	for e := range conflicting {
		events = append(events, e)
	}
	for e := range rejected {
		events = append(events, e)
	}
	slices.Sort(events)
	dead := make([]DeadLetter, len(events))
	for j, e := range events {
		if conflicting[e] {
			dead[j] = w.conflictLetter(b, e, "postgres")
		} else {
			dead[j] = w.deadLetter(b, e, &RejectError{EventID: b.Events[e].ID, Reason: rejected[e].Error()})
		}
	}
	return dead, nil
}

// conflictLetter is the dead letter of event i of b, a conflicting
// duplicate found by layer (lru or postgres).
func (w *Writer) conflictLetter(b *Batch, i int, layer string) DeadLetter {
	e := b.Events[i]
	w.log.Warn("dedup.conflict: event_id reused with a different payload; the first version's effects stand",
		"step", "dedup.conflict", "event_id", e.ID.String(), "bus", w.cfg.Bus, "layer", layer,
		"topic", e.Topic, "partition", e.Partition, "offset", e.Offset)
	return DeadLetter{
		Topic: e.Topic, Partition: e.Partition, Offset: e.Offset,
		EventID: uuid.NullUUID{UUID: e.ID, Valid: true},
		Reason:  ReasonConflict, Key: e.Key, Value: e.Value,
	}
}
