package dedup_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// retentionEnv is a migrated schema with helpers to claim keys and to
// move the slices' start times into the past (time passing, without
// sleeping).
type retentionEnv struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
}

func newRetentionEnv(t *testing.T) *retentionEnv {
	pool := sinktest.Pool(t)
	return &retentionEnv{t: t, pool: pool, schema: sinktest.Schema(t, pool)}
}

func (e *retentionEnv) claim(keys ...dedup.Key) []bool {
	e.t.Helper()
	var got []bool
	err := pgx.BeginFunc(e.t.Context(), e.pool, func(tx pgx.Tx) error {
		var err error
		got, err = dedup.Claim(e.t.Context(), tx, e.schema, "kafka", "", keys, nil)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

// age sets slice n's start to ago before now.
func (e *retentionEnv) age(n int, ago time.Duration) {
	e.t.Helper()
	tag, err := e.pool.Exec(e.t.Context(), `UPDATE `+pgx.Identifier{e.schema, "processed_events_slices"}.Sanitize()+
		` SET started_at = now() - make_interval(secs => $2) WHERE slice = $1`, n, ago.Seconds())
	if err != nil || tag.RowsAffected() != 1 {
		e.t.Fatalf("age slice %d: %v (%d rows)", n, err, tag.RowsAffected())
	}
}

// rotate starts slice 1: slice 0 is aged past an hour's horizon and a
// retention step runs.
func (e *retentionEnv) rotate() {
	e.t.Helper()
	e.age(0, time.Hour+time.Minute)
	if res, err := e.retention(time.Hour).Step(e.t.Context()); err != nil || !res.Rotated {
		e.t.Fatalf("rotation: %+v, %v", res, err)
	}
}

func (e *retentionEnv) slices() []int32 {
	e.t.Helper()
	var ids []int32
	if err := e.pool.QueryRow(e.t.Context(), `SELECT coalesce(array_agg(slice ORDER BY slice), '{}') FROM `+
		pgx.Identifier{e.schema, "processed_events_slices"}.Sanitize()).Scan(&ids); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

func (e *retentionEnv) partitions() int64 {
	e.t.Helper()
	return sinktest.Count(e.t, e.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhparent
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = 'processed_events'`, e.schema)
}

func (e *retentionEnv) retention(horizon time.Duration) dedup.Retention {
	return dedup.Retention{Pool: e.pool, Schema: e.schema, Horizon: horizon, LockTimeout: 300 * time.Millisecond}
}

func key() dedup.Key { return dedup.Key{EventID: uuid.New(), Handler: "h"} }

// A key is caught as a duplicate for the whole horizon, across a rotation,
// and forgotten only once its slice ended a horizon ago: the boundary on
// both sides.
func TestRetentionHorizon(t *testing.T) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	r := e.retention(time.Hour)
	a := key()
	if got := e.claim(a); !got[0] {
		t.Fatal("a new key was not claimed")
	}

	// The slice is younger than its width: nothing happens.
	if res, err := r.Step(ctx); err != nil || res.Rotated || len(res.Dropped) > 0 || res.Current != 0 {
		t.Fatalf("step on a young slice = %+v, %v; want nothing done", res, err)
	}
	// An hour later (the width, with one slice per horizon) slice 1 starts.
	e.age(0, time.Hour+time.Minute)
	res, err := r.Step(ctx)
	if err != nil || !res.Rotated || res.Current != 1 || len(res.Dropped) > 0 {
		t.Fatalf("step after the width = %+v, %v; want slice 1 started, nothing dropped", res, err)
	}
	b := key()
	if got := e.claim(a, b); got[0] || !got[1] {
		t.Fatalf("after the rotation: claimed %v, want [false true] (a is in the older slice)", got)
	}
	if got := e.claim(b); got[0] {
		t.Fatal("a key claimed in the current slice was claimed again")
	}

	// Slice 0 ended a minute less than the horizon ago: a is kept.
	e.age(1, time.Hour-time.Minute)
	if res, err := r.Step(ctx); err != nil || len(res.Dropped) > 0 {
		t.Fatalf("step within the horizon = %+v, %v; want nothing dropped", res, err)
	}
	if got := e.claim(a); got[0] {
		t.Fatal("a key claimed less than the horizon ago was claimed again")
	}
	// Slice 0 ended the horizon ago: it is dropped whole, a is forgotten
	// (its redelivery is applied again: past the horizon), b is kept.
	e.age(1, time.Hour+time.Second)
	res, err = r.Step(ctx)
	if err != nil || len(res.Dropped) != 1 || res.Dropped[0] != 0 {
		t.Fatalf("step past the horizon = %+v, %v; want slice 0 dropped", res, err)
	}
	if got := e.slices(); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		// Slice 1 was also older than its width: a new one started first.
		t.Fatalf("live slices = %v, want [1 2]", got)
	}
	if n := e.partitions(); n != 2 {
		t.Errorf("processed_events has %d partitions, want 2", n)
	}
	if got := e.claim(a, b); !got[0] || got[1] {
		t.Fatalf("after the drop: claimed %v, want [true false]", got)
	}
}

// After a rotation a claim looks each key up in the older slice by its
// event and handler: another handler of an event claimed there, a repeat
// in the batch, and a key of the current slice are each settled on their
// own.
func TestClaimAcrossSlices(t *testing.T) {
	e := newRetentionEnv(t)
	x := uuid.New()
	xa, xb := dedup.Key{EventID: x, Handler: "a"}, dedup.Key{EventID: x, Handler: "b"}
	old, cur, fresh := key(), key(), key()
	if got := e.claim(xa, old); !got[0] || !got[1] {
		t.Fatalf("claims in slice 0: %v", got)
	}
	e.rotate()
	if got := e.claim(cur); !got[0] {
		t.Fatal("a new key was not claimed in slice 1")
	}
	got := e.claim(xb, fresh, xa, old, cur, xb, fresh)
	want := []bool{true, true, false, false, false, false, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("claimed %v, want %v", got, want)
		}
	}
}

// LookupClaim finds keys in every slice, with the digest stored, and
// claims the rest once each, at each key's first index; no claim of them
// is contended. InsertClaim claims the same keys, finds none, and reports
// its claim contended (a key was in the current slice); Digests reads the
// digests of the keys it did not claim, from every slice.
func TestLookupClaim(t *testing.T) {
	for _, f := range lookupClaims {
		t.Run(f.name, func(t *testing.T) { lookupClaim(t, f.name, f.claim) })
	}
}

// lookupClaims are the two claims the Writer makes: a look-up then a COPY,
// and an insert that is its own look-up.
var lookupClaims = []struct {
	name  string
	claim func(ctx context.Context, q dedup.Querier, schema, bus, traceID string, keys []dedup.Key, digests []dedup.Digest) (dedup.Claims, error)
}{
	{"copy", dedup.LookupClaim},
	{"insert", dedup.InsertClaim},
}

func lookupClaim(t *testing.T, name string, claim func(ctx context.Context, q dedup.Querier, schema, bus, traceID string, keys []dedup.Key, digests []dedup.Digest) (dedup.Claims, error)) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	x := uuid.New()
	xa, xb := dedup.Key{EventID: x, Handler: "a"}, dedup.Key{EventID: x, Handler: "b"}
	old, cur, fresh := key(), key(), key()
	d := dedup.PayloadDigest([]byte("x"))
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := dedup.Claim(ctx, tx, e.schema, "kafka", "", []dedup.Key{xa, old}, []dedup.Digest{d})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.rotate()
	e.claim(cur)
	var c dedup.Claims
	var read []dedup.Digest
	keys := []dedup.Key{xb, fresh, xa, old, cur, xb, fresh}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		if c, err = claim(ctx, tx, e.schema, "kafka", "", keys, nil); err != nil {
			return err
		}
		read, err = dedup.Digests(ctx, tx, pgx.Identifier{e.schema, "processed_events"}.Sanitize(), []dedup.Key{xa, old})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	insert := name == "insert"
	if c.Contended != insert {
		t.Errorf("contended %v, want %v: a key in the current slice is the mark of a contended claim to the insert only", c.Contended, insert)
	}
	wantClaimed := []bool{true, true, false, false, false, false, false}
	wantFound := []bool{false, false, !insert, !insert, !insert, false, false}
	for i := range wantClaimed {
		if c.Claimed[i] != wantClaimed[i] || c.Found[i] != wantFound[i] {
			t.Fatalf("claimed %v found %v, want %v %v", c.Claimed, c.Found, wantClaimed, wantFound)
		}
	}
	if !insert && (c.Stored[2] != d || c.Stored[3] != (dedup.Digest{})) {
		t.Errorf("stored digests of xa, old = %x, %x; want %x, zero", c.Stored[2], c.Stored[3], d)
	}
	if insert && (c.Stored[2] != (dedup.Digest{}) || c.Stored[4] != (dedup.Digest{})) {
		t.Errorf("InsertClaim reported stored digests %x: it reads none", c.Stored)
	}
	if read[0] != d || read[1] != (dedup.Digest{}) {
		t.Errorf("digests read of xa, old = %x, %x; want %x, zero", read[0], read[1], d)
	}
	if got := e.claim(xb, fresh); got[0] || got[1] {
		t.Errorf("keys LookupClaim claimed were claimed again: %v", got)
	}
}

// A rotation waits for the claims in flight: a transaction that claimed a
// key in the current slice and has not committed holds the rotation off,
// and a claim of the same key that starts meanwhile, in another
// transaction, is settled against it after the rotation — never claimed
// twice across two slices.
func TestRetentionRotationWaitsForClaims(t *testing.T) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	k := key()
	e.age(0, 2*time.Hour)

	tx1, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(context.Background()) //nolint:errcheck
	if got, err := dedup.Claim(ctx, tx1, e.schema, "kafka", "", []dedup.Key{k}, nil); err != nil || !got[0] {
		t.Fatalf("first claim: %v, %v", got, err)
	}

	// A short lock timeout: the rotation gives up, nothing changes.
	short := e.retention(time.Hour)
	if res, err := short.Step(ctx); err != nil || !res.Busy || res.Rotated {
		t.Fatalf("step during an open claim = %+v, %v; want busy, not rotated", res, err)
	}
	if got := e.slices(); len(got) != 1 {
		t.Fatalf("slices after a busy step = %v, want [0]", got)
	}

	// A patient rotation waits; a second claim of k queues behind it.
	patient := short
	patient.LockTimeout = 30 * time.Second
	var wg sync.WaitGroup
	var res dedup.StepResult
	var stepErr, claimErr error
	var second []bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, stepErr = patient.Step(ctx)
	}()
	waitLockWaiters(t, e.pool, e.schema, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		claimErr = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			second, err = dedup.Claim(ctx, tx, e.schema, "kafka", "", []dedup.Key{k}, nil)
			return err
		})
	}()
	waitLockWaiters(t, e.pool, e.schema, 2)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if stepErr != nil || !res.Rotated || res.Current != 1 {
		t.Fatalf("patient step = %+v, %v; want slice 1 started", res, stepErr)
	}
	if claimErr != nil {
		t.Fatal(claimErr)
	}
	if second[0] {
		t.Fatal("the key was claimed twice: once in slice 0, once in slice 1")
	}
	if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+pgx.Identifier{e.schema, "processed_events"}.Sanitize()+
		` WHERE event_id = $1`, k.EventID); n != 1 {
		t.Fatalf("%d rows for the key, want 1", n)
	}
}

// waitLockWaiters waits until n sessions wait for schema's slice lock
// (the advisory lock dedup takes on "onceflow.dedup.slices:<schema>"), not
// for the advisory locks of other tests sharing the database.
func waitLockWaiters(t *testing.T, pool *pgxpool.Pool, schema string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if sinktest.Count(t, pool, `SELECT count(*) FROM pg_locks, hashtextextended($1, 0) AS h
WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
  AND classid = ((h >> 32) & 4294967295)::oid AND objid = (h & 4294967295)::oid`, "onceflow.dedup.slices:"+schema) >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d sessions never waited for the slice lock", n)
}

// Several maintainers on one schema: one rotates, the others do nothing,
// and nobody fails.
func TestRetentionConcurrentMaintainers(t *testing.T) {
	e := newRetentionEnv(t)
	e.age(0, 2*time.Hour)
	r := e.retention(time.Hour)
	var wg sync.WaitGroup
	results := make([]dedup.StepResult, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = r.Step(t.Context())
		}()
	}
	wg.Wait()
	rotated := 0
	for i := range results {
		if errs[i] != nil {
			t.Errorf("maintainer %d: %v", i, errs[i])
		}
		if results[i].Rotated {
			rotated++
		}
	}
	if rotated != 1 {
		t.Errorf("%d maintainers rotated, want 1", rotated)
	}
	if got := e.slices(); len(got) != 2 {
		t.Errorf("slices = %v, want [0 1]", got)
	}
}

// Run keeps the table to the horizon on the real clock: with a horizon of
// a second, keys claimed in the first slice are gone a few seconds later,
// and the number of partitions stays bounded while claims go on.
func TestRetentionRun(t *testing.T) {
	e := newRetentionEnv(t)
	r := e.retention(time.Second)
	r.Slices = 2
	r.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	first := key()
	e.claim(first)
	most := int64(0)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if got := e.claim(key()); !got[0] {
			t.Fatal("a new key was not claimed")
		}
		most = max(most, e.partitions())
		if ids := e.slices(); ids[0] > 0 {
			break // slice 0, with first, is gone
		}
		if time.Now().After(deadline) {
			t.Fatalf("slice 0 was not dropped within 20s (slices %v)", e.slices())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.claim(first); !got[0] {
		t.Error("a key past the horizon, its slice dropped, was still a duplicate")
	}
	// Two slices per horizon: at most the current one, two older ones
	// within the horizon and one due for dropping.
	if most > 4 {
		t.Errorf("up to %d partitions, want at most 4", most)
	}
}

func TestRetentionValidate(t *testing.T) {
	err := dedup.Retention{Slices: 99, Interval: -1}.Validate()
	for _, want := range []string{"Pool is required", "Horizon must be > 0", "Slices must be between 1 and", "Interval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %q", err, want)
		}
	}
}

// Claim and LookupClaim refuse a transaction that is not READ COMMITTED:
// a snapshot taken before a rotation committed would claim in the old
// slice. The error says so once, in context.
func TestClaimNeedsReadCommitted(t *testing.T) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	const want = "claim events: the transaction is REPEATABLE READ; a claim needs READ COMMITTED"
	for _, tc := range []struct {
		name  string
		claim func(tx pgx.Tx) error
	}{
		{"Claim", func(tx pgx.Tx) error {
			_, err := dedup.Claim(ctx, tx, e.schema, "kafka", "", []dedup.Key{key()}, nil)
			return err
		}},
		{"LookupClaim", func(tx pgx.Tx) error {
			_, err := dedup.LookupClaim(ctx, tx, e.schema, "kafka", "", []dedup.Key{key()}, nil)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck
			err = tc.claim(tx)
			if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Count(err.Error(), "claim events") != 1 {
				t.Fatalf("claim in a REPEATABLE READ transaction: %v; want an error starting %q", err, want)
			}
		})
	}
}

// Hold keeps the slices due for dropping (a replay catching up relies on
// them) while rotations go on; once it lets go, they are dropped.
func TestRetentionHold(t *testing.T) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	a := key()
	e.claim(a)
	e.age(0, 3*time.Hour)
	reason := "a replay has not caught up"
	r := e.retention(time.Hour)
	r.Hold = func(context.Context) (string, error) { return reason, nil }
	if res, err := r.Step(ctx); err != nil || !res.Rotated {
		t.Fatalf("step = %+v, %v; want a rotation", res, err)
	}
	e.age(1, 2*time.Hour)
	res, err := r.Step(ctx)
	if err != nil || len(res.Dropped) != 0 || res.Held != reason {
		t.Fatalf("held step = %+v, %v; want nothing dropped, held", res, err)
	}
	if got := e.claim(a); got[0] {
		t.Fatal("a key of a held slice was claimed again")
	}
	reason = ""
	if res, err := r.Step(ctx); err != nil || len(res.Dropped) != 1 || res.Held != "" {
		t.Fatalf("step once released = %+v, %v; want slice 0 dropped", res, err)
	}
}

// While a transaction holds LockRetention (a rewind recording itself), no
// slice starts or is dropped.
func TestLockRetention(t *testing.T) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	e.age(0, 2*time.Hour)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := dedup.LockRetention(ctx, tx, e.schema); err != nil {
		t.Fatal(err)
	}
	r := e.retention(time.Hour)
	if res, err := r.Step(ctx); err != nil || res.Rotated || !res.Busy {
		t.Fatalf("step under LockRetention = %+v, %v; want busy, nothing done", res, err)
	}
	_ = tx.Rollback(ctx)
	if res, err := r.Step(ctx); err != nil || !res.Rotated {
		t.Fatalf("step after = %+v, %v; want a rotation", res, err)
	}
}

// A slice an older onceflow rotated in (CREATE TABLE ... LIKE, then ATTACH
// PARTITION, which names its primary key) is one whose concurrent claims
// are told apart as such: a claim that waited for another transaction's
// claim of the same key, which committed, loses it, without an error.
func TestConcurrentClaimInSliceOfOldRotate(t *testing.T) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	processed := pgx.Identifier{e.schema, "processed_events"}.Sanitize()
	s1 := pgx.Identifier{e.schema, "processed_events_s1"}.Sanitize()
	for _, stmt := range []string{
		`CREATE TABLE ` + s1 + ` (LIKE ` + processed + ` INCLUDING DEFAULTS)`,
		`ALTER TABLE ` + processed + ` ATTACH PARTITION ` + s1 + ` FOR VALUES IN (1)`,
		`INSERT INTO ` + pgx.Identifier{e.schema, "processed_events_slices"}.Sanitize() + ` VALUES (1, now())`,
	} {
		if _, err := e.pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	k := key()
	tx1, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if got, err := dedup.LookupClaim(ctx, tx1, e.schema, "kafka", "", []dedup.Key{k}, nil); err != nil || !got.Claimed[0] {
		t.Fatalf("first claim: %+v, %v", got, err)
	}
	done := make(chan error, 1)
	var second dedup.Claims
	go func() {
		done <- pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			second, err = dedup.LookupClaim(ctx, tx, e.schema, "kafka", "", []dedup.Key{k}, nil)
			return err
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for sinktest.Count(t, e.pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted AND transactionid::text::bigint = $1`,
		func() int64 {
			var x int64
			if err := tx1.QueryRow(ctx, `SELECT txid_current() & 4294967295`).Scan(&x); err != nil {
				t.Fatal(err)
			}
			return x
		}()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second claim never waited for the first")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the second claim of a key in a slice of the old rotate: %v, want it lost without an error", err)
	}
	if second.Claimed[0] {
		t.Error("the second claim won a key the first committed")
	}
}

// A step says when the next rotation and drop are due, on the local
// clock: past due while a drop is held or a rotation cannot take its
// locks, in the future once they happened. Run passes the same to OnStep,
// counting busy steps in a row.
func TestRetentionStatusSaysWhatIsOverdue(t *testing.T) {
	e := newRetentionEnv(t)
	ctx := t.Context()
	r := e.retention(time.Hour)
	res, err := r.Step(ctx)
	if err != nil || res.Slices != 1 || !res.DropDue.IsZero() || !res.RotationDue.After(time.Now()) {
		t.Fatalf("young slice: %+v, %v; want 1 slice, rotation due in the future, no drop due", res, err)
	}

	// A rotation kept from its lock is past due: the slice was due to be
	// replaced an hour ago.
	e.age(0, 2*time.Hour)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := dedup.LockRetention(ctx, tx, e.schema); err != nil {
		t.Fatal(err)
	}
	res, err = r.Step(ctx)
	if err != nil || !res.Busy || res.Slices != 1 {
		t.Fatalf("step under LockRetention = %+v, %v; want busy, 1 slice", res, err)
	}
	if late := time.Since(res.RotationDue); late < 59*time.Minute || late > 61*time.Minute {
		t.Errorf("rotation is %v late, want an hour (the slice is 2h old, its width 1h)", late)
	}
	var got []dedup.RetentionStatus
	run := r
	rctx, stop := context.WithCancel(ctx)
	run.OnStep = func(s dedup.RetentionStatus) {
		got = append(got, s)
		if len(got) == 2 {
			stop()
		}
	}
	run.Interval = 10 * time.Millisecond
	if err := run.Run(rctx); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].Busy != 2 || got[1].Schema != e.schema || got[1].Slices != 1 || time.Since(got[1].RotationDue) < 59*time.Minute {
		t.Errorf("Run's statuses under LockRetention = %+v; want the second with 2 busy steps and the rotation an hour late", got)
	}
	_ = tx.Rollback(ctx)

	// Rotated, with drops held: the old slice is due to be dropped an hour
	// from its end, the new one to be replaced in an hour.
	r.Hold = func(context.Context) (string, error) { return "a replay has not caught up", nil }
	if res, err = r.Step(ctx); err != nil || !res.Rotated || res.Slices != 2 {
		t.Fatalf("step after the lock = %+v, %v; want a rotation, 2 slices", res, err)
	}
	e.age(1, 3*time.Hour)
	res, err = r.Step(ctx)
	if err != nil || res.Held == "" || res.Slices != 3 {
		t.Fatalf("held step = %+v, %v; want held, 3 slices (one more rotation)", res, err)
	}
	if late := time.Since(res.DropDue); late < 119*time.Minute || late > 121*time.Minute {
		t.Errorf("held drop is %v late, want 2h (slice 0 ended 3h ago, the horizon is 1h)", late)
	}
	if !res.RotationDue.After(time.Now()) {
		t.Errorf("rotation due %v after a rotation, want in the future", res.RotationDue)
	}
	r.Hold = nil
	if res, err = r.Step(ctx); err != nil || len(res.Dropped) != 1 || res.Slices != 2 {
		t.Fatalf("step once released = %+v, %v; want slice 0 dropped, 2 left", res, err)
	}
}
