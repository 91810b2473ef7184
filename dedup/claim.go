package dedup

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Querier is the part of a pgx transaction that Claim, Digests and
// Unclaim use; pgx.Tx satisfies it. A claim's COPY goes on q.Conn() when q
// has that method, as a pgx.Tx does, rather than through q.CopyFrom.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
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
// current slice (one pipelined round trip), looks the keys up in the older
// slices (a second one, only when there are older slices), then writes the
// rest into the current slice by COPY, under a savepoint. Most keys a
// claim sees are new, and COPY writes them at a fraction of an insert's
// cost. When one of them is in the current slice already, the COPY fails
// on the primary key: Claim rolls back to the savepoint and inserts the
// keys with ON CONFLICT DO NOTHING, which skips the ones present (a key
// present is the mark of a concurrent claim, which a second COPY would
// meet as often as not). The lock
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
	current, todo, err := t.lockAbsent(ctx, q, keys)
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	if _, err := t.write(ctx, q, newClaimSet(keys, digests, bus, traceID, current), todo, claimed); err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	return claimed, nil
}

// lockAbsent takes the slice lock and returns the current slice and the
// indexes of the distinct keys of keys that no older slice holds, in
// (event_id, handler) order: what Claim and InsertClaim write into the
// current slice. The older slices are looked up only when there are any.
func (t tables) lockAbsent(ctx context.Context, q Querier, keys []Key) (current int32, todo []int, err error) {
	current, oldest, err := t.lockSlices(ctx, q)
	if err != nil {
		return 0, nil, err
	}
	todo = distinctKeys(keys)
	if oldest < current {
		if todo, err = t.absent(ctx, q, "<", current, keys, todo); err != nil {
			return 0, nil, err
		}
	}
	return current, todo, nil
}

// ClaimHeld claims keys in slice with one INSERT … ON CONFLICT DO NOTHING
// (one round trip) and reports, index by index, which it claimed: the
// first copy of each key that no row holds; a key present, committed or
// claimed earlier in the transaction, is not claimed. It is for a
// transaction that took the slice lock and learned the current slice from
// an earlier [LookupClaim] (the lock keeps it current until the
// transaction ends), and holds the keys (claimed then [Unclaim]ed): no
// concurrent claim of them can then be in progress, and the look-up and
// the COPY's savepoint that [Claim] costs buy nothing. A key another
// transaction holds makes it wait, like any unique-index insert.
func ClaimHeld(ctx context.Context, q Querier, schema, bus, traceID string, slice int32, keys []Key, digests []Digest) ([]bool, error) {
	claimed := make([]bool, len(keys))
	if len(keys) == 0 {
		return claimed, nil
	}
	c := newClaimSet(keys, digests, bus, traceID, slice)
	c.todo = distinctKeys(keys)
	if _, err := tablesOf(schema).insertClaims(ctx, q, c, claimed); err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	return claimed, nil
}

// Claims is what LookupClaim reports, index by index of its keys.
type Claims struct {
	Claimed []bool   // claimed by this call
	Found   []bool   // claimed before it: committed, or earlier in this transaction
	Stored  []Digest // for a key found, the payload digest stored with its claim (zero when none)
	Slice   int32    // the current slice, which the keys claimed went to

	// Contended reports that a key the look-up did not find was in the
	// current slice when the claim wrote it: a concurrent transaction
	// claimed it (and committed, or held it until the claim's write
	// waited for it). A COPY that meets such a key is rolled back and the
	// keys are inserted instead; a caller whose claims are often
	// contended spends less with [InsertClaim]. From InsertClaim: a key
	// was in the current slice already, claimed concurrently or before.
	Contended bool
}

// LookupClaim looks keys up and claims the ones not found: [Lookup] and
// [Claim] in one. It takes the slice lock first, so the look-up sees every
// slice as it stays for the transaction, and the claim need not probe the
// older slices again. A key neither claimed nor found is a later copy of a
// key at a lower index, or a key a concurrent transaction claimed and
// committed while this one waited for it; its digest is not read. Looking
// up first costs a read in a batch of new keys; it keeps a redelivery the
// caller did not know about from failing the claim's COPY, which would
// leave the rows copied before it dead and write them again.
//
// The transaction requirements are Claim's.
func LookupClaim(ctx context.Context, q Querier, schema, bus, traceID string, keys []Key, digests []Digest) (Claims, error) {
	c := Claims{Claimed: make([]bool, len(keys))}
	if len(keys) == 0 {
		c.Found, c.Stored = []bool{}, []Digest{}
		return c, nil
	}
	t := tablesOf(schema)
	// One round trip: the lock, the slices and the look-up, in this order
	// (the look-up's snapshot is taken after the lock is held). The COPY's
	// savepoint goes with the COPY, so a batch found whole (a replay's
	// re-read) has nothing to release.
	b := &pgx.Batch{}
	t.queueLock(b)
	l := newLookupKeys(keys)
	b.Queue(lookupSQL(t.processed), l.ids)
	current, err := lookupLocked(q.SendBatch(ctx, b), t, keys, l, &c)
	c.Slice = current
	if err != nil {
		return c, fmt.Errorf("claim events: %w", err)
	}
	// Only the keys not found are ordered for the COPY: a batch that was
	// all applied before sorts nothing.
	todo := make([]int, 0, len(keys))
	for i := range keys {
		if !c.Found[i] {
			todo = append(todo, i)
		}
	}
	todo = distinct(keys, todo)
	if len(todo) == 0 {
		return c, nil
	}
	cs := newClaimSet(keys, digests, bus, traceID, current)
	if c.Contended, err = t.write(ctx, q, cs, todo, c.Claimed); err != nil {
		return c, fmt.Errorf("claim events: %w", err)
	}
	return c, nil
}

// InsertClaim claims keys with one INSERT … ON CONFLICT DO NOTHING into
// the current slice, in (event_id, handler) order, without looking them
// up there first: the insert's own probe of the primary key is the
// look-up. It reports which keys it claimed; it finds nothing (Found is
// all false, Stored all zero): a key not claimed was claimed before — in
// any slice, committed, or by a concurrent transaction that committed
// while the insert waited for it — or is a later copy of a key at a
// lower index; [Digests] reads the digests stored with such keys.
// Contended reports that a key was in the current slice already (a
// redelivery, committed or concurrent: the insert does not tell them
// apart).
//
// Against [LookupClaim] it saves a probe of every key (the look-up) and
// the COPY's savepoint, and spends an insert's per-row work instead of
// COPY's; measured with benchmarks/ceiling, the insert alone costs
// Postgres less than a look-up and a COPY, and a stream with redeliveries
// it misses in the cache costs less with it (benchmarks/PROFILE.md). Older
// slices are looked up first, as Claim does them, when there are any. The
// transaction requirements are Claim's.
func InsertClaim(ctx context.Context, q Querier, schema, bus, traceID string, keys []Key, digests []Digest) (Claims, error) {
	c := Claims{Claimed: make([]bool, len(keys)), Found: make([]bool, len(keys)), Stored: make([]Digest, len(keys))}
	if len(keys) == 0 {
		return c, nil
	}
	t := tablesOf(schema)
	current, todo, err := t.lockAbsent(ctx, q, keys)
	c.Slice = current
	if err != nil {
		return c, fmt.Errorf("claim events: %w", err)
	}
	if len(todo) == 0 {
		return c, nil
	}
	cs := newClaimSet(keys, digests, bus, traceID, current)
	cs.todo = todo
	n, err := t.insertClaims(ctx, q, cs, c.Claimed)
	if err != nil {
		return c, fmt.Errorf("claim events: %w", err)
	}
	c.Contended = n < len(todo)
	return c, nil
}

// lookupLocked reads the results of LookupClaim's pipeline into c and
// returns the current slice.
func lookupLocked(br pgx.BatchResults, t tables, keys []Key, l lookupKeys, c *Claims) (current int32, err error) {
	defer br.Close()
	current, _, err = t.readLock(br)
	rows, qerr := br.Query()
	if qerr == nil {
		found, stored, lerr := readLookup(rows, keys, l)
		if err == nil && lerr != nil {
			err = lerr
		}
		c.Found, c.Stored = found, stored
	} else if err == nil {
		err = fmt.Errorf("look up claims: %w", qerr)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return current, err
}

// write claims the keys at todo into the current slice and sets claimed[i]
// for each it claimed: by COPY, and when a key is in the current slice
// already (a concurrent claim), by insert, which skips the keys present.
// It reports whether the COPY met such a key.
func (t tables) write(ctx context.Context, q Querier, c claimSet, todo []int, claimed []bool) (contended bool, err error) {
	if len(todo) == 0 {
		return false, nil
	}
	c.todo = todo
	copied, err := t.copyClaims(ctx, q, c)
	if err != nil {
		return false, err
	}
	if copied {
		for _, i := range todo {
			claimed[i] = true
		}
		return false, nil
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int("onceflow.claim.copy_conflicts", 1))
	_, err = t.insertClaims(ctx, q, c, claimed)
	return true, err
}

// claimSet is what one Claim writes: keys[i] for each i in todo (distinct
// keys, in byte order), with digests[i], into slice.
type claimSet struct {
	keys    []Key
	digests []Digest
	todo    []int
	bus     string
	trace   *string
	slice   int32
}

func newClaimSet(keys []Key, digests []Digest, bus, traceID string, slice int32) claimSet {
	c := claimSet{keys: keys, digests: digests, bus: bus, slice: slice}
	if traceID != "" {
		c.trace = &traceID
	}
	return c
}

// digest is the digest stored with keys[i], in place in c.digests (a
// slice of a Digest value would copy it to the heap), nil for none.
func (c claimSet) digest(i int) []byte {
	if i < len(c.digests) && c.digests[i] != (Digest{}) {
		return c.digests[i][:]
	}
	return nil
}

// distinctKeys returns the index of each key's first copy in keys, in
// (event_id, handler) byte order: the order every claim writes in.
func distinctKeys(keys []Key) []int {
	todo := make([]int, len(keys))
	for i := range todo {
		todo[i] = i
	}
	return distinct(keys, todo)
}

// distinct orders the indexes todo of keys as distinctKeys does, keeping
// each key's first copy among them; it reuses todo.
func distinct(keys []Key, todo []int) []int {
	// Ties broken by index, so that a key's first copy sorts first; an
	// unstable sort with a total order is the stable sort, only cheaper.
	slices.SortFunc(todo, func(a, b int) int {
		if c := compareIDs(&keys[a].EventID, &keys[b].EventID); c != 0 {
			return c
		}
		if c := strings.Compare(keys[a].Handler, keys[b].Handler); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	out := todo[:0]
	for j, i := range todo {
		if j > 0 && keys[i] == keys[out[len(out)-1]] {
			continue // a later copy: the first one sorts first
		}
		out = append(out, i)
	}
	return out
}

// compareIDs orders ids as bytes.Compare does, by their two big-endian
// halves: no call for each comparison of a sort.
func compareIDs(a, b *uuid.UUID) int {
	if x, y := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(b[:8]); x != y {
		return cmp.Compare(x, y)
	}
	return cmp.Compare(binary.BigEndian.Uint64(a[8:]), binary.BigEndian.Uint64(b[8:]))
}

// absent returns the indexes of todo whose keys are in no slice s with
// "s op current": op "<" looks in the older slices, which are no longer
// written (what they hold is committed); "=" in the current one, as of
// this statement. It is one statement: an index scan of each slice for the
// batch's distinct event ids (one descent per event, not per key: an
// event's handlers sit side by side in the key), whose rows are matched
// with the keys here. The slice is a parameter, not a subquery, so that
// the scan is pruned to the partitions it names.
func (t tables) absent(ctx context.Context, q Querier, op string, current int32, keys []Key, todo []int) ([]int, error) {
	ids := make(uuidArray, 0, len(todo))
	for _, i := range todo { // in event_id order: each id once
		if id := keys[i].EventID; len(ids) == 0 || ids[len(ids)-1].Bytes != id {
			ids = append(ids, uuidParam(id))
		}
	}
	rows, err := q.Query(ctx, `SELECT event_id, handler FROM `+t.processed+`
WHERE event_id = ANY($1::uuid[]) AND slice `+op+` $2::integer`, ids, current)
	if err != nil {
		return nil, fmt.Errorf("look up claims: %w", err)
	}
	found, err := keySet(rows, 0)
	if err != nil {
		return nil, fmt.Errorf("look up claims: %w", err)
	}
	if len(found) == 0 {
		return todo, nil
	}
	out := todo[:0]
	for _, i := range todo {
		if _, ok := found[keys[i]]; !ok {
			out = append(out, i)
		}
	}
	return out, nil
}

// uniqueViolation is Postgres' SQLSTATE unique_violation.
const uniqueViolation = "23505"

// claimColumns are the columns a claim writes; processed_at takes its
// default.
var claimColumns = []string{"event_id", "handler", "bus", "trace_id", "payload_digest", "slice"}

// copyClaims writes c by COPY under the savepoint onceflow_claim, opened
// with the COPY, and reports whether it did. The savepoint is released
// when it returns no error; after an error the transaction is aborted and
// must be rolled back. false: some key of c is in the slice already (committed, or
// inserted by a transaction that committed while the COPY waited for
// it), or the COPY wrote fewer rows than c has, the COPY was rolled back
// to the savepoint, and nothing of c is written. Only a violation of the
// slice's primary key is a key present: any other error, a violation of
// another unique index (one a user added, or one a trigger writes to)
// among them, is an error, with the transaction aborted.
func (t tables) copyClaims(ctx context.Context, q Querier, c claimSet) (bool, error) {
	n, err := t.copy(ctx, q, c)
	// A row COPY did not write (a trigger on processed_events that skips
	// it) is no claim: rolled back, the keys go to the insert, whose
	// RETURNING says which it wrote.
	var pgErr *pgconn.PgError
	present := errors.As(err, &pgErr) && pgErr.Code == uniqueViolation && pgErr.ConstraintName == pkeyName(c.slice)
	if present || (err == nil && n != int64(len(c.todo))) {
		// Released too: ROLLBACK TO keeps the savepoint, and what the
		// transaction does next would run in a subtransaction of it.
		if _, err := q.Exec(ctx, `ROLLBACK TO SAVEPOINT onceflow_claim; RELEASE SAVEPOINT onceflow_claim`); err != nil {
			return false, err
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("copy claims into %s: %w", sliceName(c.slice), err)
	}
	if _, err := q.Exec(ctx, `RELEASE SAVEPOINT onceflow_claim`); err != nil {
		return false, err
	}
	return true, nil
}

// copy opens the savepoint onceflow_claim and writes c into its slice by
// binary COPY, and returns the rows written. On a Querier with a Conn
// method (a pgx transaction) it encodes the rows itself, into a buffer
// kept for the next claim, and sends them on that connection, under a
// span of its own ("copy_from <table>", as otelpgx names pgx's): pgx's
// CopyFrom encodes each value through its type map and grows a new buffer
// for each COPY, a quarter of what a steady stream allocated; the
// savepoint goes in the COPY's query, with no round trip of its own.
// Other Queriers' CopyFrom is called, after the savepoint's Exec.
func (t tables) copy(ctx context.Context, q Querier, c claimSet) (int64, error) {
	table := pgx.Identifier{t.schema, sliceName(c.slice)}
	cq, ok := q.(interface{ Conn() *pgx.Conn })
	if !ok {
		if _, err := q.Exec(ctx, `SAVEPOINT onceflow_claim`); err != nil {
			return 0, err
		}
		j := 0
		row := []any{nil, nil, c.bus, c.trace, nil, c.slice} // reused: COPY encodes each row before asking for the next
		return q.CopyFrom(ctx, table, claimColumns, pgx.CopyFromFunc(func() ([]any, error) {
			if j == len(c.todo) {
				return nil, nil
			}
			i := c.todo[j]
			j++
			row[0], row[1], row[4] = uuidParam(c.keys[i].EventID), c.keys[i].Handler, c.digest(i)
			return row, nil
		}))
	}
	ctx, span := trace.SpanFromContext(ctx).TracerProvider().Tracer("github.com/onceflow/onceflow/dedup").Start(ctx,
		"copy_from "+table.Sanitize(), trace.WithAttributes(attribute.Int("onceflow.rows", len(c.todo))))
	defer span.End()
	buf := c.appendBinary(getCopyBuf(c.binarySize()))
	tag, err := cq.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(buf),
		`SAVEPOINT onceflow_claim; COPY `+table.Sanitize()+` (`+strings.Join(claimColumns, ", ")+`) FROM STDIN BINARY`)
	if err != nil {
		// Not kept: on a broken connection pgconn can return while its
		// sender still reads the buffer. A key present is no failure of
		// the claim, which goes on without the COPY.
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != uniqueViolation || pgErr.ConstraintName != pkeyName(c.slice) {
			span.SetStatus(codes.Error, err.Error())
		}
		return 0, err
	}
	putCopyBuf(buf)
	return tag.RowsAffected(), nil
}

// copyBufs keeps, for the next claims, up to its capacity of the buffers
// claims are encoded into for COPY, each at most maxCopyBuf: a sync.Pool
// loses what it holds at every garbage collection, which a steady stream
// runs every few batches, and each claim then grew a buffer anew.
var copyBufs = make(chan []byte, 8)

// maxCopyBuf bounds a buffer copyBufs keeps (a batch of about 10 000
// keys): what it holds stays at most 8 MiB.
const maxCopyBuf = 1 << 20

// getCopyBuf returns an empty buffer with room for n bytes: a kept one if
// it has the room, else a new one, made once rather than grown, with a
// quarter more room, so that it serves the slightly larger claims of the
// next batches too.
func getCopyBuf(n int) []byte {
	select {
	case b := <-copyBufs:
		if cap(b) >= n {
			return b[:0]
		}
	default:
	}
	return make([]byte, 0, n+n/4)
}

// putCopyBuf keeps b for a later claim, unless copyBufs is full or b is
// over maxCopyBuf.
func putCopyBuf(b []byte) {
	if cap(b) > maxCopyBuf {
		return
	}
	select {
	case copyBufs <- b:
	default:
	}
}

// binarySize is the length of appendBinary's encoding of c.
func (c claimSet) binarySize() int {
	n := 11 + 4 + 4 + 2 // signature, flags, header extension, the end
	for _, i := range c.todo {
		n += 2 + 4 + 16 + 4 + len(c.keys[i].Handler) + 4 + len(c.bus) + 4 + 4 + 4 + 4
		if c.trace != nil {
			n += len(*c.trace)
		}
		n += len(c.digest(i))
	}
	return n
}

// appendBinary appends the rows of c in COPY's binary format, in the order
// of claimColumns, to b.
func (c claimSet) appendBinary(b []byte) []byte {
	b = append(b, "PGCOPY\n\xff\r\n\x00"...)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, 0) // header extension length
	field := func(b, v []byte, null bool) []byte {
		if null {
			return binary.BigEndian.AppendUint32(b, 0xffffffff) // -1: NULL
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		return append(b, v...)
	}
	text := func(b []byte, v string) []byte {
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		return append(b, v...)
	}
	for _, i := range c.todo {
		b = binary.BigEndian.AppendUint16(b, uint16(len(claimColumns)))
		b = field(b, c.keys[i].EventID[:], false)
		b = text(b, c.keys[i].Handler)
		b = text(b, c.bus)
		if c.trace == nil {
			b = field(b, nil, true)
		} else {
			b = text(b, *c.trace)
		}
		d := c.digest(i)
		b = field(b, d, d == nil)
		b = binary.BigEndian.AppendUint32(b, 4)
		b = binary.BigEndian.AppendUint32(b, uint32(c.slice))
	}
	return binary.BigEndian.AppendUint16(b, 0xffff) // -1: the end
}

// insertClaims inserts c with ON CONFLICT DO NOTHING, sets claimed[i]
// for each key it inserted and returns how many it inserted. A key
// present is not claimed: the statement waits for a concurrent
// transaction that holds it, like any unique-index insert. On a pgx
// transaction using the extended protocol, the parameters are encoded
// here (see binaryParams); otherwise through pgx.
func (t tables) insertClaims(ctx context.Context, q Querier, c claimSet, claimed []bool) (int, error) {
	// The rows come in the order of todo; WITH ORDINALITY numbers them.
	sql := `INSERT INTO ` + t.slice(c.slice) + ` (event_id, handler, bus, trace_id, payload_digest, slice)
SELECT k.event_id, k.handler, $3, $4, k.digest, $6
FROM unnest($1::uuid[], $2::text[], $5::bytea[]) WITH ORDINALITY AS k(event_id, handler, digest, j)
ORDER BY k.j
ON CONFLICT (event_id, handler, slice) DO NOTHING
RETURNING event_id, handler`
	var rows rawRows
	if conn, ok := binaryConn(q); ok {
		p := c.insertParams()
		defer p.release()
		rows = execBinary(ctx, conn, "INSERT", sql, p, len(c.todo))
	} else {
		ids := make(uuidArray, len(c.todo))
		handlers := make([]string, len(c.todo))
		ds := make([][]byte, len(c.todo))
		for j, i := range c.todo {
			ids[j] = uuidParam(c.keys[i].EventID)
			handlers[j] = c.keys[i].Handler
			ds[j] = c.digest(i) // in place: no copy of each digest
		}
		r, err := q.Query(ctx, sql, ids, handlers, c.bus, c.trace, ds, c.slice)
		if err != nil {
			return 0, fmt.Errorf("insert claims into %s: %w", sliceName(c.slice), err)
		}
		rows = r
	}
	n, err := c.readInserted(rows, claimed)
	if err != nil {
		return 0, fmt.Errorf("insert claims into %s: %w", sliceName(c.slice), err)
	}
	return n, nil
}

// insertParams encodes insertClaims' parameters $1 to $6.
func (c claimSet) insertParams() *binaryParams {
	size := 6 * 20
	for _, i := range c.todo {
		size += 3*4 + 16 + len(c.keys[i].Handler) + len(c.digest(i))
	}
	p := newBinaryParams(size)
	p.array(len(c.todo), oidUUID, false)
	for _, i := range c.todo {
		p.element(c.keys[i].EventID[:])
	}
	p.end(oidUUIDArray)
	p.array(len(c.todo), oidText, false)
	for _, i := range c.todo {
		p.textElement(c.keys[i].Handler)
	}
	p.end(oidTextArray)
	p.text(c.bus)
	p.nullableText(c.trace)
	nulls := false
	for _, i := range c.todo {
		if c.digest(i) == nil {
			nulls = true
			break
		}
	}
	p.array(len(c.todo), oidBytea, nulls)
	for _, i := range c.todo {
		p.element(c.digest(i))
	}
	p.end(oidByteaArr)
	p.int4(c.slice)
	return p
}

// rawRows are the methods of pgx.Rows that readInserted uses; a
// *resultRows has them too.
type rawRows interface {
	Next() bool
	RawValues() [][]byte
	FieldDescriptions() []pgconn.FieldDescription
	Err() error
	Close()
}

// readInserted reads the (event_id, handler) rows an insert of c returned,
// sets claimed[i] for each key of c.todo among them and returns how many
// there were. It reads the rows' raw values and finds each key by binary
// search in c.todo, which is in (event_id, handler) order: no map, and no
// string for each handler.
func (c claimSet) readInserted(rows rawRows, claimed []bool) (int, error) {
	defer rows.Close()
	n := 0
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) != 2 {
			return 0, fmt.Errorf("%d columns returned, want 2", len(vals))
		}
		var id uuid.UUID
		if rows.FieldDescriptions()[0].Format == pgx.BinaryFormatCode {
			if len(vals[0]) != len(id) {
				return 0, fmt.Errorf("an event id of %d bytes returned", len(vals[0]))
			}
			copy(id[:], vals[0])
		} else {
			var err error
			if id, err = uuid.ParseBytes(vals[0]); err != nil {
				return 0, fmt.Errorf("an event id returned: %w", err)
			}
		}
		handler := vals[1] // text: the same bytes in either format
		j, ok := slices.BinarySearchFunc(c.todo, 0, func(i, _ int) int {
			if d := compareIDs(&c.keys[i].EventID, &id); d != 0 {
				return d
			}
			return compareText(c.keys[i].Handler, handler)
		})
		if !ok {
			return 0, fmt.Errorf("a key returned that was not inserted: %s %q", id, handler)
		}
		claimed[c.todo[j]] = true
		n++
	}
	return n, rows.Err()
}

// compareText orders s and b as strings.Compare(s, string(b)) does,
// without the conversion.
func compareText(s string, b []byte) int {
	for k := 0; k < len(s) && k < len(b); k++ {
		if s[k] != b[k] {
			return cmp.Compare(s[k], b[k])
		}
	}
	return cmp.Compare(len(s), len(b))
}

// keySet reads rows of (event_id, handler) into a set; size is a hint.
func keySet(rows pgx.Rows, size int) (map[Key]struct{}, error) {
	set := make(map[Key]struct{}, size)
	var id [16]byte
	var handler string
	_, err := pgx.ForEachRow(rows, []any{&id, &handler}, func() error {
		set[Key{EventID: id, Handler: handler}] = struct{}{}
		return nil
	})
	return set, err
}

// uuidParam is id as a uuid parameter. Arrays of pgtype.UUID encode in
// every query exec mode: binary where the statement is described, text
// under QueryExecModeExec and QueryExecModeSimpleProtocol (a DSN's
// default_query_exec_mode, as set behind a transaction pooler), where
// arrays of [16]byte or uuid.UUID have no encoding.
func uuidParam(id [16]byte) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

// uuidArray is a uuid[] parameter. Where the statement is described, pgx
// encodes it in binary as the array it is (pgtype.ArrayGetter), with each
// element handed over by pointer: pgx's encoding of a []pgtype.UUID goes
// through reflection and boxes every element, an allocation per id.
// Where it is not (QueryExecModeExec, QueryExecModeSimpleProtocol), pgx
// sends its TextValue, the array's literal.
type uuidArray []pgtype.UUID

// TextValue implements pgtype.TextValuer: the array's literal, {} when
// empty.
func (a uuidArray) TextValue() (pgtype.Text, error) {
	b := make([]byte, 0, 2+37*len(a))
	b = append(b, '{')
	for i := range a {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, uuid.UUID(a[i].Bytes).String()...)
	}
	b = append(b, '}')
	return pgtype.Text{String: string(b), Valid: true}, nil
}

// Dimensions implements pgtype.ArrayGetter: one dimension, from 1.
func (a uuidArray) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter: a pointer to the i-th id, which
// costs no allocation as an any.
func (a uuidArray) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a uuidArray) IndexType() any { return new(pgtype.UUID) }
