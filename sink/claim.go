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
	if len(keys) == 0 {
		return nil, nil, nil
	}
	ctx, span := w.tracer.Start(ctx, "dedup.claim", trace.WithAttributes(attribute.Int("onceflow.keys", len(keys))))
	won, stored, err := w.claimKeys(ctx, tx, b, keys, traceID)
	endSpan(span, err)
	return won, stored, err
}

func (w *Writer) claimKeys(ctx context.Context, tx pgx.Tx, b *Batch, keys []pending, traceID string) ([]bool, []dedup.Digest, error) {
	won := make([]bool, len(keys))
	stored := make([]dedup.Digest, len(keys))
	pk := partitionKey{b.Topic, b.Partition}
	v, _ := w.duplicates.Load(pk)
	lookFirst, _ := v.(bool)
	todo := make([]int, 0, len(keys)) // indexes into keys still to claim
	if lookFirst {
		found, ds, err := dedup.Lookup(ctx, tx, w.processed, keysAt(keys, nil))
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
	if len(todo) > 0 {
		ds := make([]dedup.Digest, len(todo))
		for j, i := range todo {
			ds[j] = keys[i].digest
		}
		got, err := dedup.Claim(ctx, tx, w.cfg.Schema, w.cfg.Bus, traceID, keysAt(keys, todo), ds)
		if err != nil {
			return nil, nil, err
		}
		for j, i := range todo {
			won[i] = got[j]
		}
		if err := w.lostDigests(ctx, tx, keys, todo, won, stored); err != nil {
			return nil, nil, err
		}
	}
	// The next batch of the partition looks up first when most of this
	// one's keys were claimed already.
	lost := 0
	for _, ok := range won {
		if !ok {
			lost++
		}
	}
	if dup := 2*lost > len(keys); dup != lookFirst {
		w.duplicates.Store(pk, dup)
	}
	return won, stored, nil
}

// lostDigests sets stored[i] for each claimed key todo lost. A key lost to
// its own first copy in this batch (the same record twice) stores that
// copy's digest, known here; the others' are read in one round trip, only
// when there are such keys.
func (w *Writer) lostDigests(ctx context.Context, tx pgx.Tx, keys []pending, todo []int, won []bool, stored []dedup.Digest) error {
	var winner map[dedup.Key]int // index in keys of the copy of a key that won
	var read []int
	for _, i := range todo {
		if won[i] {
			continue
		}
		if winner == nil {
			winner = make(map[dedup.Key]int, len(todo))
			for _, k := range todo {
				if won[k] {
					winner[keys[k].key] = k
				}
			}
		}
		if first, ok := winner[keys[i].key]; ok {
			stored[i] = keys[first].digest
		} else {
			read = append(read, i)
		}
	}
	if len(read) == 0 {
		return nil
	}
	ds, err := dedup.Digests(ctx, tx, w.processed, keysAt(keys, read))
	if err != nil {
		return err
	}
	for j, i := range read {
		stored[i] = ds[j]
	}
	return nil
}

// keysAt returns the keys of keys at the indexes at; all of them when at is
// nil.
func keysAt(keys []pending, at []int) []dedup.Key {
	if at == nil {
		ks := make([]dedup.Key, len(keys))
		for i, p := range keys {
			ks[i] = p.key
		}
		return ks
	}
	ks := make([]dedup.Key, len(at))
	for j, i := range at {
		ks[j] = keys[i].key
	}
	return ks
}
