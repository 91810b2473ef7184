package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func TestCache(t *testing.T) {
	var disabled *dedup.Cache
	k := dedup.Key{EventID: uuid.New(), Handler: "h"}
	disabled.Remember([]dedup.Key{k}, nil)
	if seen, _ := disabled.Seen(k, dedup.Digest{}); seen {
		t.Error("a nil cache reported a key as seen")
	}
	if c, err := dedup.New(0); err != nil || c != nil {
		t.Errorf("New(0) = %v, %v; want nil, nil (disabled)", c, err)
	}
	if _, err := dedup.New(-1); err == nil {
		t.Error("New(-1) returned no error")
	}

	c, err := dedup.New(2)
	if err != nil {
		t.Fatal(err)
	}
	a, b, d := dedup.Key{EventID: uuid.New(), Handler: "h"}, dedup.Key{EventID: uuid.New(), Handler: "h"}, dedup.Key{EventID: uuid.New(), Handler: "h"}
	if seen, _ := c.Seen(a, dedup.Digest{}); seen {
		t.Fatal("an empty cache saw a key")
	}
	c.Remember([]dedup.Key{a, b}, nil)
	if sa, _ := c.Seen(a, dedup.Digest{}); !sa {
		t.Fatal("remembered keys are not seen")
	}
	if sb, _ := c.Seen(b, dedup.Digest{}); !sb {
		t.Fatal("remembered keys are not seen")
	}
	if seen, _ := c.Seen(dedup.Key{EventID: a.EventID, Handler: "other"}, dedup.Digest{}); seen {
		t.Error("the same event under another handler was seen: keys must include the handler")
	}
	c.Remember([]dedup.Key{d}, nil) // evicts the least recently used
	if got := c.Stats().Len; got != 2 {
		t.Errorf("Len = %d, want 2 (bounded)", got)
	}
	if s := c.Stats(); s.Hits != 2 || s.Misses != 2 {
		t.Errorf("stats = %+v, want 2 hits and 2 misses", s)
	}
}

func TestClaim(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	x, y := uuid.New(), uuid.New()
	claim := func(keys ...dedup.Key) []bool {
		t.Helper()
		var got []bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			got, err = dedup.Claim(ctx, tx, schema, "kafka", "", keys, nil)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	kx, ky := dedup.Key{EventID: x, Handler: "a"}, dedup.Key{EventID: y, Handler: "a"}
	kxb := dedup.Key{EventID: x, Handler: "b"}

	for _, tc := range []struct {
		name string
		keys []dedup.Key
		want []bool
	}{
		{"new keys, one repeated in the batch", []dedup.Key{kx, kx, kxb}, []bool{true, false, true}},
		{"already claimed, and one new", []dedup.Key{kxb, ky, kx}, []bool{false, true, false}},
		{"nothing", nil, []bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := claim(tc.keys...)
			if len(got) != len(tc.want) {
				t.Fatalf("claimed %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("key %d claimed = %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
	// A claim whose transaction rolls back claims nothing.
	z := dedup.Key{EventID: uuid.New(), Handler: "a"}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{z}, nil); err != nil || !got[0] {
		t.Fatalf("claim in a transaction: %v, %v", got, err)
	}
	_ = tx.Rollback(context.Background())
	if got := claim(z); !got[0] {
		t.Error("a key claimed by a rolled-back transaction could not be claimed again")
	}
}

// claimResult is what a claim made in the background returned.
type claimResult struct {
	got []bool
	err error
}

// claimInBackground claims keys in a transaction of its own, in a
// goroutine that ends with the send of its result.
func claimInBackground(ctx context.Context, pool *pgxpool.Pool, schema string, keys ...dedup.Key) <-chan claimResult {
	done := make(chan claimResult, 1)
	go func() {
		var r claimResult
		r.err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			r.got, err = dedup.Claim(ctx, tx, schema, "kafka", "", keys, nil)
			return err
		})
		done <- r
	}()
	return done
}

// A claim that finds a key present falls back from COPY to an insert that
// skips it, rolling back only its own attempt: what the transaction wrote
// before the claim stays.
func TestClaimFallbackKeepsTransaction(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	x := dedup.Key{EventID: uuid.New(), Handler: "a"}
	y := dedup.Key{EventID: uuid.New(), Handler: "a"}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if got, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{x}, nil); err != nil || !got[0] {
			t.Errorf("first claim of x: %v, %v", got, err)
		}
		got, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{y, x}, nil)
		if err != nil || !got[0] || got[1] {
			t.Errorf("claim of y, x after x: %v, %v; want [true false]", got, err)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "processed_events"}.Sanitize()+
		` WHERE event_id = ANY($1)`, []uuid.UUID{x.EventID, y.EventID}).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%d rows for x and y after commit, want 2", n)
	}
}

// Two transactions claiming the same key: the second waits for the first
// and claims the key only if the first rolls back.
func TestClaimConcurrent(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	for _, commit := range []bool{true, false} {
		a := dedup.Key{EventID: uuid.New(), Handler: "a"}
		b := dedup.Key{EventID: uuid.New(), Handler: "a"}
		c := dedup.Key{EventID: uuid.New(), Handler: "a"}
		first, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := dedup.Claim(ctx, first, schema, "kafka", "", []dedup.Key{a, b}, nil); err != nil || !got[0] || !got[1] {
			t.Fatalf("first claim: %v, %v", got, err)
		}
		done := claimInBackground(ctx, pool, schema, c, b)
		select {
		case r := <-done:
			t.Fatalf("second claim returned %v, %v while the first held b", r.got, r.err)
		case <-time.After(300 * time.Millisecond):
		}
		if commit {
			err = first.Commit(ctx)
		} else {
			err = first.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if want := !commit; !r.got[0] || r.got[1] != want {
			t.Errorf("first committed %v: second claimed %v, want [true %v]", commit, r.got, want)
		}
	}
}

// A claim whose COPY meets a concurrent claim settles the keys by insert
// at once, with no second look-up and COPY (which a second concurrent
// claim would make fail again): it waits for each holder in turn, claims
// what is free and nothing the others committed, and its COPY conflicted
// once.
func TestClaimContendedInserts(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	// b < c < d in the claim's order, so its COPY waits on b first, then d.
	ordered := func(first byte) dedup.Key {
		id := uuid.New()
		id[0] = first
		return dedup.Key{EventID: id, Handler: "a"}
	}
	b, c, d := ordered(0x10), ordered(0x20), ordered(0x30)
	hold := func(k dedup.Key) pgx.Tx {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{k}, nil); err != nil || !got[0] {
			t.Fatalf("hold %v: %v, %v", k, got, err)
		}
		return tx
	}
	holdB, holdD := hold(b), hold(d)
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	claimCtx, span := tracer.Start(ctx, "claim")
	done := claimInBackground(claimCtx, pool, schema, d, c, b)
	for _, tx := range []pgx.Tx{holdB, holdD} {
		time.Sleep(300 * time.Millisecond) // the claim waits on this one's key
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := <-done
	span.End()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.got[0] || !r.got[1] || r.got[2] {
		t.Errorf("claimed %v, want [false true false] (d and b were claimed by others)", r.got)
	}
	conflicts := int64(-1)
	for _, s := range rec.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "onceflow.claim.copy_conflicts" {
				conflicts = a.Value.AsInt64()
			}
		}
	}
	if conflicts != 1 {
		t.Errorf("copy conflicts recorded: %d, want 1 (the insert settles the rest)", conflicts)
	}
}

// One entry holds an event for all its handlers: the size counts events,
// handlers remembered later join the entry, and keys of handlers past
// MaxCacheHandlers are never cached.
func TestCacheEntryPerEvent(t *testing.T) {
	c, err := dedup.New(2)
	if err != nil {
		t.Fatal(err)
	}
	x, y := uuid.New(), uuid.New()
	key := func(id uuid.UUID, h string) dedup.Key { return dedup.Key{EventID: id, Handler: h} }
	dx := dedup.PayloadDigest([]byte("x"))
	c.Remember([]dedup.Key{key(x, "a"), key(x, "b"), key(y, "a")}, []dedup.Digest{dx, dx, {}})
	if n := c.Stats().Len; n != 2 {
		t.Errorf("Len = %d after two events of two and one handlers, want 2", n)
	}
	for _, tc := range []struct {
		k              dedup.Key
		seen, conflict bool
	}{
		{key(x, "a"), true, false},
		{key(x, "b"), true, false},
		{key(x, "c"), false, false},
		{key(y, "a"), true, false},
		{key(y, "b"), false, false},
	} {
		if seen, conflict := c.Seen(tc.k, dx); seen != tc.seen || conflict != tc.conflict {
			t.Errorf("Seen(%s) = %v, %v; want %v, %v", tc.k.Handler, seen, conflict, tc.seen, tc.conflict)
		}
	}
	if _, conflict := c.Seen(key(x, "a"), dedup.PayloadDigest([]byte("other"))); !conflict {
		t.Error("another payload under x's id was not a conflict")
	}
	c.Remember([]dedup.Key{key(x, "c")}, nil) // joins x's entry, keeps its digest
	if seen, conflict := c.Seen(key(x, "c"), dedup.PayloadDigest([]byte("other"))); !seen || !conflict {
		t.Errorf("x's later handler: seen %v, conflict %v; want true, true", seen, conflict)
	}
	if seen, _ := c.Seen(key(x, "a"), dx); !seen {
		t.Error("x's first handler was forgotten when a later one joined")
	}

	many, _ := dedup.New(10)
	z := uuid.New()
	var keys []dedup.Key
	for i := range dedup.MaxCacheHandlers + 1 {
		keys = append(keys, key(z, fmt.Sprintf("h%d", i)))
	}
	many.Remember(keys, nil)
	for i, k := range keys {
		if seen, _ := many.Seen(k, dedup.Digest{}); seen != (i < dedup.MaxCacheHandlers) {
			t.Errorf("handler %d of %d: seen %v", i, len(keys), seen)
		}
	}
}

// An entry has one digest, but an event's handlers may have stored
// different ones (handlers of two topics that saw the id with different
// payloads: no conflict, the key is per handler). Seen must then answer as
// Postgres would, handler by handler: a miss is always right (Postgres
// decides), but a hit must not call a handler's own payload a conflict,
// nor another payload a plain duplicate.
func TestCacheDigestsDifferByHandler(t *testing.T) {
	x := uuid.New()
	a, b := dedup.Key{EventID: x, Handler: "a"}, dedup.Key{EventID: x, Handler: "b"}
	d1, d2 := dedup.PayloadDigest([]byte("1")), dedup.PayloadDigest([]byte("2"))
	for _, tc := range []struct {
		name     string
		remember func(c *dedup.Cache)
	}{
		{"in two batches", func(c *dedup.Cache) {
			c.Remember([]dedup.Key{a}, []dedup.Digest{d1})
			c.Remember([]dedup.Key{b}, []dedup.Digest{d2})
		}},
		{"in one call", func(c *dedup.Cache) { c.Remember([]dedup.Key{a, b}, []dedup.Digest{d1, d2}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dedup.New(10)
			if err != nil {
				t.Fatal(err)
			}
			tc.remember(c)
			for _, q := range []struct {
				name     string
				k        dedup.Key
				d        dedup.Digest
				conflict bool
			}{
				{"a with the payload a stored", a, d1, false},
				{"a with b's payload", a, d2, true},
				{"b with the payload b stored", b, d2, false},
				{"b with a's payload", b, d1, true},
			} {
				if seen, conflict := c.Seen(q.k, q.d); seen && conflict != q.conflict {
					t.Errorf("%s: seen, conflict %v; want a miss or conflict %v", q.name, conflict, q.conflict)
				}
			}
		})
	}
}

// A claim is reported only for a row that was written: a trigger on
// processed_events that skips a row (returns NULL) makes the claim fail
// rather than report a key claimed that no row holds.
func TestClaimSkippedRowIsNotClaimed(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	table := pgx.Identifier{schema, "processed_events"}.Sanitize()
	fn := pgx.Identifier{schema, "skip_some"}.Sanitize()
	for _, stmt := range []string{
		`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.handler = 'skipped' THEN RETURN NULL; END IF; RETURN NEW; END $$`,
		`CREATE TRIGGER skip_some BEFORE INSERT ON ` + table + ` FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	id := uuid.New()
	keys := []dedup.Key{{EventID: id, Handler: "kept"}, {EventID: id, Handler: "skipped"}}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err := dedup.Claim(ctx, tx, schema, "kafka", "", keys, nil)
		if err == nil && got[1] {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE event_id = $1 AND handler = 'skipped'`, id).Scan(&n); err != nil {
				return err
			}
			t.Errorf("claim reports %v with %d rows for the skipped key; want an error or the key not claimed", got, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A claim that fell back from its COPY leaves no savepoint open: what the
// transaction does next runs in it, not in a subtransaction of the claim.
func TestClaimFallbackLeavesNoSavepoint(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	x := dedup.Key{EventID: uuid.New(), Handler: "a"}
	y := dedup.Key{EventID: uuid.New(), Handler: "a"}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // test cleanup
	for _, keys := range [][]dedup.Key{{x}, {y, x}} {
		if _, err := dedup.Claim(ctx, tx, schema, "kafka", "", keys, nil); err != nil {
			t.Fatal(err)
		}
	}
	if savepointOpen(t, tx) {
		t.Error("a savepoint onceflow_claim is still open after the claim")
	}
}

// A unique violation that is not of processed_events' primary key — here
// a unique index a user added on (handler, payload_digest) — is no
// concurrent claim: Claim and LookupClaim return it from their first COPY
// as the error it is, without looking the keys up and COPYing again.
func TestClaimOtherUniqueViolation(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	table := pgx.Identifier{schema, "processed_events"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX digest_once ON `+table+` (handler, payload_digest, slice)`); err != nil {
		t.Fatal(err)
	}
	d := dedup.PayloadDigest([]byte("same payload"))
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{{EventID: uuid.New(), Handler: "a"}}, []dedup.Digest{d})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		claim func(ctx context.Context, tx pgx.Tx, keys []dedup.Key) error
	}{
		{"Claim", func(ctx context.Context, tx pgx.Tx, keys []dedup.Key) error {
			_, err := dedup.Claim(ctx, tx, schema, "kafka", "", keys, []dedup.Digest{d})
			return err
		}},
		{"LookupClaim", func(ctx context.Context, tx pgx.Tx, keys []dedup.Key) error {
			_, err := dedup.LookupClaim(ctx, tx, schema, "kafka", "", keys, []dedup.Digest{d})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
			claimCtx, span := tracer.Start(ctx, "claim")
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
			err = tc.claim(claimCtx, tx, []dedup.Key{{EventID: uuid.New(), Handler: "a"}})
			span.End()
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23505" || !strings.Contains(pgErr.ConstraintName, "payload_digest") {
				t.Fatalf("claim of another event with the same digest: %v; want the unique violation of the added index", err)
			}
			for _, s := range rec.Ended() {
				for _, a := range s.Attributes() {
					if a.Key == "onceflow.claim.copy_conflicts" {
						t.Errorf("copy conflicts recorded: %d, want none (the violation is not of the primary key)", a.Value.AsInt64())
					}
				}
			}
		})
	}
}
