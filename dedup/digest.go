package dedup

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Digest is a 16-byte fingerprint of an event's payload: the first half of
// the SHA-256 of the record value's bytes, exactly as received. The zero
// Digest means "unknown" (a processed_events row written before digests
// were stored) and never conflicts with anything.
//
// The digest is of bytes, not of meaning: a producer that serializes the
// same event twice with fields in another order or other whitespace makes
// two different digests, and the second delivery is a conflict.
type Digest [16]byte

// PayloadDigest returns the Digest of payload.
func PayloadDigest(payload []byte) Digest {
	s := sha256.Sum256(payload)
	var d Digest
	copy(d[:], s[:len(d)])
	return d
}

// Conflicts reports whether a and b are both known and differ: the same
// event id carried two different payloads.
func (a Digest) Conflicts(b Digest) bool {
	return a != Digest{} && b != Digest{} && a != b
}

// Digests returns, index by index, the payload digest stored in
// processed_events for each key: the zero Digest when the row has none
// (written before digests existed) or does not exist. It is one round
// trip; in a transaction it sees the transaction's own claims. Writers
// call it only on the duplicate path, for the keys Claim did not claim.
func Digests(ctx context.Context, q Querier, table string, keys []Key) ([]Digest, error) {
	_, ds, err := Lookup(ctx, q, table, keys)
	if err != nil {
		return nil, fmt.Errorf("read payload digests: %w", err)
	}
	return ds, nil
}

// Lookup reports, index by index, whether each key has a processed_events
// row and the payload digest stored with it (zero when none). It is one
// round trip that writes nothing; in a transaction it sees the
// transaction's own claims and what committed before it. A key found is
// claimed for good (a committed claim is never taken back), so a writer
// that expects duplicates may look its keys up first and claim only the
// ones not found; a key not found may still be claimed by a concurrent
// transaction, which Claim settles.
func Lookup(ctx context.Context, q Querier, table string, keys []Key) ([]bool, []Digest, error) {
	if len(keys) == 0 {
		return []bool{}, []Digest{}, nil
	}
	l := newLookupKeys(keys)
	rows, err := q.Query(ctx, lookupSQL(table), l.ids)
	if err != nil {
		return nil, nil, fmt.Errorf("look up claims: %w", err)
	}
	return readLookup(rows, keys, l)
}

// lookupSQL reads the claims of a set of event ids, one index descent per
// event, not per key: an event's handlers sit side by side in the key. The
// rows are matched with the keys by readLookup.
func lookupSQL(table string) string {
	return `SELECT event_id, handler, payload_digest FROM ` + table + ` WHERE event_id = ANY($1::uuid[])`
}

// lookupKeys indexes keys by event id for lookupSQL: ids is the distinct
// event ids (lookupSQL's parameter), first[id] the index of id's first
// key and next[i] that of the key of the same event after keys[i] (-1:
// none). One map serves the parameter and the reading of the rows.
type lookupKeys struct {
	ids   uuidArray
	first map[[16]byte]int
	next  []int
}

func newLookupKeys(keys []Key) lookupKeys {
	l := lookupKeys{ids: make(uuidArray, 0, len(keys)), first: make(map[[16]byte]int, len(keys)), next: make([]int, len(keys))}
	for i := len(keys) - 1; i >= 0; i-- {
		l.next[i] = -1
		if j, ok := l.first[keys[i].EventID]; ok {
			l.next[i] = j
		} else {
			l.ids = append(l.ids, uuidParam(keys[i].EventID))
		}
		l.first[keys[i].EventID] = i
	}
	return l
}

// readLookup reads lookupSQL's rows into Lookup's results for keys. A row
// is matched with the keys of its event (an event's keys are found by id,
// then by handler), its handler and digest read in place: a batch that
// was all applied before, as a replay re-reads it, costs no allocation
// per row.
func readLookup(rows pgx.Rows, keys []Key, l lookupKeys) ([]bool, []Digest, error) {
	first, next := l.first, l.next
	found := make([]bool, len(keys))
	out := make([]Digest, len(keys))
	var id [16]byte
	var handler, d pgtype.DriverBytes // valid until the next row
	_, err := pgx.ForEachRow(rows, []any{&id, &handler, &d}, func() error {
		i, ok := first[id]
		for ; ok && i >= 0; i = next[i] {
			if keys[i].Handler != string(handler) {
				continue // another handler's row of the same event, or another key's
			}
			found[i] = true
			if len(d) == len(out[i]) {
				out[i] = Digest(d)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("look up claims: %w", err)
	}
	return found, out, nil
}

// Unclaim deletes the processed_events rows of keys. A writer uses it,
// inside the claiming transaction, to take back claims it made for an
// event it then refused (a conflicting duplicate), so that no row says a
// handler applied what it did not.
func Unclaim(ctx context.Context, q Querier, table string, keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	ids := make(uuidArray, len(keys))
	handlers := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = uuidParam(k.EventID)
		handlers[i] = k.Handler
	}
	rows, err := q.Query(ctx, `DELETE FROM `+table+` p USING unnest($1::uuid[], $2::text[]) AS k(event_id, handler)
WHERE p.event_id = k.event_id AND p.handler = k.handler`, ids, handlers)
	if err != nil {
		return fmt.Errorf("unclaim events: %w", err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("unclaim events: %w", err)
	}
	return nil
}
