// A batch that defers its offset (Batch.DeferOffset) and is found whole in
// Postgres: one look-up outside any transaction, and nothing written.

package sink

import (
	"context"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
)

// foundWhole reports whether b has nothing to write, looking in
// Postgres outside any transaction: its dead letters (records it could not
// decode) are in dead_letters at their offsets already, and every key is
// claimed with its event's payload digest. It returns the keys as skips
// then (none when there are none), else nil: a dead letter not recorded,
// a key not claimed, or a claim that stored another digest (a conflict,
// which the transaction refuses). A claim or a dead letter found is
// committed and stays so (only retention drops claims, after the
// horizon), so no transaction is needed to trust it.
func (w *Writer) foundWhole(ctx context.Context, b *Batch, keys []pending) ([]skip, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout) // bounded as a transaction is
	defer cancel()
	if len(b.DeadLetters) > 0 {
		if ok, err := w.deadLettersRecorded(ctx, b); err != nil || !ok {
			return nil, err
		}
	}
	if len(keys) == 0 {
		return []skip{}, nil
	}
	ctx, span := w.tracer.Start(ctx, "dedup.lookup", trace.WithAttributes(attribute.Int("onceflow.keys", len(keys))))
	found, stored, err := dedup.Lookup(ctx, w.pool, w.processed, keysAt(keys, nil))
	if err != nil {
		endSpan(span, err)
		return nil, err
	}
	out := make([]skip, 0, len(keys))
	for i, p := range keys {
		if !found[i] || stored[i].Conflicts(p.digest) {
			break
		}
		out = append(out, skip{p.key, p.event, "postgres", stored[i]})
	}
	span.SetAttributes(attribute.Bool("onceflow.found_whole", len(out) == len(keys)))
	span.End()
	if len(out) < len(keys) {
		return nil, nil
	}
	return out, nil
}

// deadLettersRecorded reports whether every dead letter of b is in
// dead_letters already, at its offset and under b's topic id (a row of
// another id, or of none, is another record: see insertDeadLetters):
// writing it again would change nothing.
func (w *Writer) deadLettersRecorded(ctx context.Context, b *Batch) (bool, error) {
	offsets := make([]int64, len(b.DeadLetters))
	for i, d := range b.DeadLetters {
		if d.Topic != b.Topic || d.Partition != b.Partition {
			return false, nil
		}
		offsets[i] = d.Offset
	}
	var n int
	err := w.pool.QueryRow(ctx, `SELECT count(*) FROM `+w.dead+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND "offset" = ANY($4::bigint[])
  AND topic_id IS NOT DISTINCT FROM $5::uuid`,
		w.cfg.Group, b.Topic, b.Partition, offsets, b.TopicID).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("look up dead letters: %w", err)
	}
	return n == len(slices.Compact(slices.Sorted(slices.Values(offsets)))), nil
}
