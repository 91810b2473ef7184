package sink

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
)

// claim claims keys in tx and returns, index by index, whether this
// transaction claimed each key and, for those it did not, the payload
// digest stored with the claim that exists (zero when unknown): what the
// conflict check compares; and the slice the claims went to.
//
// dedup.LookupClaim looks the keys up first (a key found is a duplicate,
// claimed for good, with its digest at hand) and claims the rest by COPY,
// which settles concurrent claims; after a claim that met a concurrent
// one, the Writer's next claims insert instead (see claimKeys). A key lost
// there to another transaction has its digest read in one more statement,
// only when there are such keys.
//
// In an isolating transaction, h is what hold learned (nil otherwise): the
// keys found claimed then are known, with their digests, and the others
// are claimed by dedup.ClaimHeld, in one round trip.
func (w *Writer) claim(ctx context.Context, tx pgx.Tx, keys []pending, traceID string, h *held) ([]bool, []dedup.Digest, int32, error) {
	if len(keys) == 0 {
		return nil, nil, 0, nil
	}
	ctx, span := w.tracer.Start(ctx, "dedup.claim", trace.WithAttributes(attribute.Int("onceflow.keys", len(keys))))
	var won []bool
	var stored []dedup.Digest
	var slice int32
	var err error
	if h != nil {
		won, stored, err = w.claimHeld(ctx, tx, keys, traceID, h)
		slice = h.slice
	} else {
		won, stored, slice, err = w.claimKeys(ctx, tx, keys, traceID)
	}
	endSpan(span, err)
	return won, stored, slice, err
}

// held is what hold learned of an isolating transaction's keys.
type held struct {
	slice int32                      // the current dedup slice, which the transaction's claims go to
	found map[dedup.Key]dedup.Digest // keys claimed before the transaction, with their digests
}

// claimHeld claims keys in a transaction that holds them (see hold).
func (w *Writer) claimHeld(ctx context.Context, tx pgx.Tx, keys []pending, traceID string, h *held) ([]bool, []dedup.Digest, error) {
	won, stored := make([]bool, len(keys)), make([]dedup.Digest, len(keys))
	todo := make([]int, 0, len(keys)) // indexes of the keys not found by hold
	for i, p := range keys {
		if d, ok := h.found[p.key]; ok {
			stored[i] = d
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return won, stored, nil
	}
	ds := make([]dedup.Digest, len(todo))
	for j, i := range todo {
		ds[j] = keys[i].digest
	}
	claimed, err := dedup.ClaimHeld(ctx, tx, w.cfg.Schema, w.cfg.Bus, traceID, h.slice, keysAt(keys, todo), ds)
	if err != nil {
		return nil, nil, err
	}
	for j, i := range todo {
		won[i] = claimed[j]
	}
	if err := w.lostDigests(ctx, tx, keys, todo, won, stored); err != nil {
		return nil, nil, err
	}
	return won, stored, nil
}

// insertRun is how many claims in a row, after a contended one, a Writer
// writes by insert (dedup.InsertClaim) before it tries COPY again.
const insertRun = 16

// claimKeys claims keys with one dedup claim: a look-up then a COPY
// (dedup.LookupClaim: the cheapest where no key was claimed before)
// unless one of the Writer's last insertRun claims was contended; then an
// insert that is its own look-up (dedup.InsertClaim), and the last
// claim by insert won at least half its keys. A contended claim
// met a key claimed before that the look-up had not found, a concurrent
// transaction's (a batch of another partition), which makes a COPY fail
// part way and be written again; an insert's is any key claimed before, a
// redelivery the cache did not know, which the insert skips for less than
// a look-up costs. Such claims come in streaks (a producer's retries land
// within moments), so the Writer inserts until insertRun claims in a row
// meet none, then tries COPY again; a claim by insert that won fewer than
// half its keys (a re-read: keys claimed before, each costing the insert
// and the read of its digest two probes, a look-up one) goes back to the
// look-up at once.
func (w *Writer) claimKeys(ctx context.Context, tx pgx.Tx, keys []pending, traceID string) ([]bool, []dedup.Digest, int32, error) {
	ds := make([]dedup.Digest, len(keys))
	for i, k := range keys {
		ds[i] = k.digest
	}
	claim := dedup.LookupClaim
	byInsert := w.byInsert.Load() > 0
	if byInsert {
		claim = dedup.InsertClaim
	}
	c, err := claim(ctx, tx, w.cfg.Schema, w.cfg.Bus, traceID, keysAt(keys, nil), ds)
	if err != nil {
		return nil, nil, 0, err
	}
	switch {
	case byInsert && 2*claimed(c.Claimed) < len(keys):
		// Mostly keys claimed before (a re-read): each cost the insert a
		// probe and its digest's read another, where a look-up costs one.
		w.byInsert.Store(0)
	case c.Contended:
		w.byInsert.Store(insertRun)
	case byInsert:
		w.byInsert.Add(-1)
	}
	todo := make([]int, 0, len(keys)) // indexes of the keys not found
	for i, found := range c.Found {
		if !found {
			todo = append(todo, i)
		}
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int("onceflow.found_first", len(keys)-len(todo)),
		attribute.Bool("onceflow.claim.by_insert", byInsert), attribute.Bool("onceflow.claim.contended", c.Contended))
	if err := w.lostDigests(ctx, tx, keys, todo, c.Claimed, c.Stored); err != nil {
		return nil, nil, 0, err
	}
	return c.Claimed, c.Stored, c.Slice, nil
}

// claimed counts the keys won.
func claimed(won []bool) int {
	n := 0
	for _, w := range won {
		if w {
			n++
		}
	}
	return n
}

// lostDigests sets stored[i] for each claimed key todo lost. A key lost to
// its own first copy in this batch (the same record twice) stores that
// copy's digest, known here; the others' are read in one round trip, only
// when there are such keys.
func (w *Writer) lostDigests(ctx context.Context, tx pgx.Tx, keys []pending, todo []int, won []bool, stored []dedup.Digest) error {
	var lost []int
	for _, i := range todo {
		if !won[i] {
			lost = append(lost, i)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	// The copy that won each lost key, if it is in todo: a map of the lost
	// keys only, a few in a batch of hundreds.
	winner := make(map[dedup.Key]int, len(lost))
	for _, i := range lost {
		winner[keys[i].key] = -1
	}
	for _, k := range todo {
		if won[k] {
			if _, ok := winner[keys[k].key]; ok {
				winner[keys[k].key] = k
			}
		}
	}
	var read []int
	for _, i := range lost {
		if first := winner[keys[i].key]; first >= 0 {
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

// hold makes tx hold every key of keys until it ends without claiming
// any, so that the isolating transaction, which claims group by group in
// its batch's order, takes all its locks on processed_events in the order
// every claim takes them (byte order), and before any handler runs: no
// two claiming transactions then wait for each other in a cycle.
//
// It claims the keys in one dedup.LookupClaim, which writes in byte order
// and waits, as any claim does, for a concurrent transaction that holds
// one, then takes back the claims it made (dedup.Unclaim). A row tx
// inserted and deleted stays locked until tx ends: a concurrent claim of
// its key waits for tx (the unique index meets a row of a transaction in
// progress), while tx's own statements see no row, and claim the key
// again, or not, as if hold had not run, without waiting. A key hold did
// not claim is a committed claim (found, or lost to a transaction that
// committed), or a later copy of one it did: none makes tx wait again.
//
// It returns what it learned for the transaction's claims (claimHeld):
// the current slice, and the keys it found claimed, with their digests.
func (w *Writer) hold(ctx context.Context, tx pgx.Tx, keys []pending) (*held, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	ctx, span := w.tracer.Start(ctx, "dedup.hold", trace.WithAttributes(attribute.Int("onceflow.keys", len(keys))))
	ks := keysAt(keys, nil)
	c, err := dedup.LookupClaim(ctx, tx, w.cfg.Schema, w.cfg.Bus, "", ks, nil)
	h := &held{slice: c.Slice, found: map[dedup.Key]dedup.Digest{}}
	if err == nil {
		var undo []dedup.Key
		for i, won := range c.Claimed {
			if won {
				undo = append(undo, ks[i])
			}
			if c.Found[i] {
				h.found[ks[i]] = c.Stored[i]
			}
		}
		err = dedup.Unclaim(ctx, tx, w.processed, undo)
	}
	endSpan(span, err)
	if err != nil {
		return nil, err
	}
	return h, nil
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
