package sink

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
)

// partitionKey names a partition in Writer.duplicates.
type partitionKey struct {
	topic     string
	partition int32
}

// claim claims keys in tx and returns, index by index, whether this
// transaction claimed each key and, for those it did not, the payload
// digest stored with the claim that exists (zero when unknown): what the
// conflict check compares.
//
// Two ways, chosen per partition by what its previous batch found. Most
// batches carry mostly new keys (the LRU drops the redeliveries it knows):
// they are claimed at once (dedup.Claim), and the few keys lost at the
// claim have their digests read in a second statement, only when there are
// such keys. A batch that follows one whose keys were mostly claimed
// already — a replay, a rewind, a member catching up on what another
// applied — looks its keys up first (dedup.Lookup, a read): the keys found
// are duplicates with their digests at hand, and only the rest are claimed.
// A pure duplicate batch thus costs one read instead of an insert attempt
// and a read. Either way Postgres decides: a key found is claimed for good,
// and a key not found goes through Claim, which settles concurrent claims.
func (w *Writer) claim(ctx context.Context, tx pgx.Tx, b *Batch, keys []pending, traceID string) ([]bool, []dedup.Digest, error) {
	won := make([]bool, len(keys))
	stored := make([]dedup.Digest, len(keys))
	if len(keys) == 0 {
		return won, stored, nil
	}
	ctx, span := w.tracer.Start(ctx, "dedup.claim", trace.WithAttributes(attribute.Int("onceflow.keys", len(keys))))
	won, stored, err := w.claimKeys(ctx, tx, b, keys, traceID, won, stored)
	endSpan(span, err)
	return won, stored, err
}

func (w *Writer) claimKeys(ctx context.Context, tx pgx.Tx, b *Batch, keys []pending, traceID string, won []bool, stored []dedup.Digest) ([]bool, []dedup.Digest, error) {
	pk := partitionKey{b.Topic, b.Partition}
	todo := make([]int, 0, len(keys)) // indexes into keys still to claim
	lookedUp := false
	if v, ok := w.duplicates.Load(pk); ok && v.(bool) {
		lookedUp = true
		ks := make([]dedup.Key, len(keys))
		for i, p := range keys {
			ks[i] = p.key
		}
		found, ds, err := dedup.Lookup(ctx, tx, w.processed, ks)
		if err != nil {
			return nil, nil, err
		}
		for i := range keys {
			if found[i] {
				stored[i] = ds[i]
			} else {
				todo = append(todo, i)
			}
		}
		trace.SpanFromContext(ctx).SetAttributes(attribute.Int("onceflow.found_first", len(keys)-len(todo)))
	} else {
		for i := range keys {
			todo = append(todo, i)
		}
	}
	lost := len(keys) - len(todo)
	if len(todo) > 0 {
		ks := make([]dedup.Key, len(todo))
		ds := make([]dedup.Digest, len(todo))
		for j, i := range todo {
			ks[j], ds[j] = keys[i].key, keys[i].digest
		}
		got, err := dedup.Claim(ctx, tx, w.cfg.Schema, w.cfg.Bus, traceID, ks, ds)
		if err != nil {
			return nil, nil, err
		}
		var again []dedup.Key // lost to another transaction: their digests are still to read
		var at []int
		var winner map[dedup.Key]int // index in keys of the copy of a key that won, if any lost
		for j, i := range todo {
			won[i] = got[j]
			if !got[j] {
				lost++
				if winner == nil {
					winner = make(map[dedup.Key]int, len(todo))
					for jj, ii := range todo {
						if got[jj] {
							winner[keys[ii].key] = ii
						}
					}
				}
				// A key lost to its own first copy in this batch (the
				// same record twice) stores that copy's digest: no need
				// to read it back.
				if w, ok := winner[keys[i].key]; ok {
					stored[i] = keys[w].digest
					continue
				}
				again = append(again, keys[i].key)
				at = append(at, i)
			}
		}
		if len(again) > 0 {
			ds, err := dedup.Digests(ctx, tx, w.processed, again)
			if err != nil {
				return nil, nil, err
			}
			for j, i := range at {
				stored[i] = ds[j]
			}
		}
	}
	// The next batch of the partition looks up first when most of this
	// one's keys were claimed already.
	if dup := 2*lost > len(keys); dup != lookedUp {
		w.duplicates.Store(pk, dup)
	}
	return won, stored, nil
}
