package dedup

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Querier is the part of a pgx transaction that Claim, Digests and
// Unclaim use; pgx.Tx satisfies it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Claim inserts a processed_events row for every key and reports, index by
// index, which keys this statement claimed. Keys are inserted in
// (event_id, handler) order, so concurrent transactions take row locks in
// one order and do not deadlock one another.
//
// A key that appears several times in keys is claimed at most once, at its
// first index. A key already present (committed by another transaction, or
// inserted by a concurrent one that then commits) is not claimed: the
// statement waits for the concurrent transaction like any unique-index
// insert. schema is the (unquoted) schema of the tables. traceID may be
// empty, and is then stored as NULL.
//
// processed_events is partitioned by slice (see [Retention]): Claim takes
// the slice lock shared for the rest of the transaction and reads the
// current slice (one pipelined round trip), then inserts into the current
// slice the keys none of the older slices holds (a second one). The lock
// keeps the current slice from changing while the transaction runs, so
// every transaction that could claim a key concurrently inserts into the
// same slice, where the primary key settles it; the older slices are no
// longer written, so what they hold is committed and visible. Each older
// slice costs one index probe per key that is not already in the current
// one; with a single slice (no retention) there are none.
//
// digests[i] is the payload digest stored with keys[i] (see [Digests]); a
// nil digests, or a zero Digest, stores NULL.
//
// Claim must run inside the transaction that does the business writes for
// the claimed keys: the claim is only true if that transaction commits.
// The transaction must be READ COMMITTED (Claim returns an error
// otherwise): each of its statements must see what committed before it.
func Claim(ctx context.Context, q Querier, schema, bus, traceID string, keys []Key, digests []Digest) ([]bool, error) {
	claimed := make([]bool, len(keys))
	if len(keys) == 0 {
		return claimed, nil
	}
	t := tablesOf(schema)
	current, oldest, err := t.lockSlices(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	// Raw 16-byte arrays: pgx encodes them in binary; uuid.UUID would go
	// through its text form, several times slower.
	ids := make([][16]byte, len(keys))
	handlers := make([]string, len(keys))
	ds := make([][]byte, len(keys))
	for i, k := range keys {
		ids[i] = k.EventID
		handlers[i] = k.Handler
		if i < len(digests) {
			ds[i] = digests[i].bytes()
		}
	}
	var trace *string
	if traceID != "" {
		trace = &traceID
	}
	// With no older slice the probe is left out. Otherwise the slice is a
	// parameter, not a subquery, so that the probe is pruned to the
	// partitions below it when the statement runs; and OFFSET 0 keeps the
	// probe a per-key index lookup: without it the planner may turn it
	// into a hash anti-join that reads whole older slices (it did, on a
	// slice not yet analyzed, at a tenth of the rate).
	older := ""
	if oldest < current {
		older = `WHERE NOT EXISTS (SELECT 1 FROM ` + t.processed + ` o
    WHERE o.event_id = k.event_id AND o.handler = k.handler AND o.slice < $6::integer OFFSET 0)`
	}
	rows, err := q.Query(ctx, `INSERT INTO `+t.slice(current)+` (event_id, handler, bus, trace_id, payload_digest, slice)
SELECT k.event_id, k.handler, $3, $4, k.digest, $6
FROM unnest($1::uuid[], $2::text[], $5::bytea[]) AS k(event_id, handler, digest)
`+older+`
ORDER BY k.event_id, k.handler
ON CONFLICT (event_id, handler, slice) DO NOTHING
RETURNING event_id, handler`, ids, handlers, bus, trace, ds, current)
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	won := make(map[Key]struct{}, len(keys))
	var id [16]byte
	var handler string
	_, err = pgx.ForEachRow(rows, []any{&id, &handler}, func() error {
		won[Key{EventID: uuid.UUID(id), Handler: handler}] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	for i, k := range keys {
		if _, ok := won[k]; ok {
			claimed[i] = true
			delete(won, k) // later copies of the same key are duplicates
		}
	}
	return claimed, nil
}
