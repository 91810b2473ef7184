package dedup_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// savepointOpen reports whether a savepoint onceflow_claim is open in tx,
// leaving the transaction usable either way.
func savepointOpen(t *testing.T, tx pgx.Tx) bool {
	t.Helper()
	ctx := t.Context()
	if _, err := tx.Exec(ctx, `SAVEPOINT probe`); err != nil {
		t.Fatal(err)
	}
	_, err := tx.Exec(ctx, `RELEASE SAVEPOINT onceflow_claim`)
	if err == nil {
		return true
	}
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT probe; RELEASE SAVEPOINT probe`); err != nil {
		t.Fatal(err)
	}
	return false
}

// A LookupClaim that finds every key, and one that claims some, leave no
// savepoint open, whatever the query exec mode.
func TestLookupClaimLeavesNoSavepoint(t *testing.T) {
	base := sinktest.Pool(t)
	schema := sinktest.Schema(t, base)
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			pool := sinktest.ModePool(t, mode)
			x := dedup.Key{EventID: uuid.New(), Handler: "a"}
			y := dedup.Key{EventID: uuid.New(), Handler: "a"}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
			c, err := dedup.LookupClaim(ctx, tx, schema, "kafka", "", []dedup.Key{x}, nil)
			if err != nil || !c.Claimed[0] || c.Contended {
				t.Fatalf("claim x: %+v, %v", c, err)
			}
			if savepointOpen(t, tx) {
				t.Error("a savepoint onceflow_claim is open after a claim of new keys")
			}
			c, err = dedup.LookupClaim(ctx, tx, schema, "kafka", "", []dedup.Key{x, x}, nil)
			if err != nil || c.Claimed[0] || !c.Found[0] {
				t.Fatalf("claim x again: %+v, %v", c, err)
			}
			if savepointOpen(t, tx) {
				t.Error("a savepoint onceflow_claim is open after a claim that found every key")
			}
			c, err = dedup.LookupClaim(ctx, tx, schema, "kafka", "", []dedup.Key{y, x}, nil)
			if err != nil || !c.Claimed[0] || !c.Found[1] {
				t.Fatalf("claim y, x: %+v, %v", c, err)
			}
			if savepointOpen(t, tx) {
				t.Error("a savepoint onceflow_claim is open after a claim of y, x")
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A LookupClaim whose COPY meets a key a concurrent transaction committed
// meanwhile rolls that COPY back, inserts the rest and leaves no
// savepoint open; an InsertClaim skips the key. Both report the
// claim contended.
func TestLookupClaimFirstCopyConflicts(t *testing.T) {
	// The COPY goes on the transaction's connection, or through the
	// Querier's CopyFrom when it has no Conn method.
	for _, q := range []struct {
		name string
		of   func(pgx.Tx) dedup.Querier
	}{
		{"pgx transaction", func(tx pgx.Tx) dedup.Querier { return tx }},
		{"other querier", func(tx pgx.Tx) dedup.Querier { return hiddenConn{tx} }},
	} {
		for _, f := range lookupClaims {
			t.Run(q.name+"/"+f.name, func(t *testing.T) { lookupClaimFirstCopyConflicts(t, q.of, f.claim) })
		}
	}
}

func lookupClaimFirstCopyConflicts(t *testing.T, querier func(pgx.Tx) dedup.Querier,
	claim func(ctx context.Context, q dedup.Querier, schema, bus, traceID string, keys []dedup.Key, digests []dedup.Digest) (dedup.Claims, error)) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	b := dedup.Key{EventID: uuid.New(), Handler: "a"}
	c := dedup.Key{EventID: uuid.New(), Handler: "a"}
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := dedup.Claim(ctx, hold, schema, "kafka", "", []dedup.Key{b}, nil); err != nil || !got[0] {
		t.Fatalf("hold b: %v, %v", got, err)
	}
	type result struct {
		c    dedup.Claims
		open bool
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			r.c, err = claim(ctx, querier(tx), schema, "kafka", "", []dedup.Key{c, b}, nil)
			if err == nil {
				if _, err := tx.Exec(ctx, `SAVEPOINT probe`); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `RELEASE SAVEPOINT onceflow_claim`); err == nil {
					r.open = true
					return nil
				}
				_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT probe; RELEASE SAVEPOINT probe`)
			}
			return err
		})
		done <- r
	}()
	waitRowLockWaiters(t, pool, hold)
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.c.Claimed[0] || r.c.Claimed[1] || r.c.Found[1] || !r.c.Contended {
		t.Errorf("claims of c, b: %+v; want c claimed, b neither claimed nor found, the claim contended", r.c)
	}
	if r.open {
		t.Error("a savepoint onceflow_claim is open after a claim whose first COPY conflicted")
	}
}

// waitRowLockWaiters waits until a session waits for hold, the open
// transaction that holds a key: only sessions hold blocks count, not the
// lock waits of other tests sharing the database.
func waitRowLockWaiters(t *testing.T, pool *pgxpool.Pool, hold pgx.Tx) {
	t.Helper()
	var pid uint32
	if err := hold.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		if sinktest.Count(t, pool, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE %d = ANY(pg_blocking_pids(pid))`, pid)) > 0 {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("no session waited for the held key")
}

// LookupClaim's errors in its pipeline: a REPEATABLE READ transaction,
// an empty slices table. Each is an error naming the problem, and leaves
// no savepoint open in the transaction, which the error did not abort.
func TestLookupClaimPipelineErrors(t *testing.T) {
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) { lookupClaimPipelineErrors(t, sinktest.ModePool(t, mode)) })
	}
}

func lookupClaimPipelineErrors(t *testing.T, pool *pgxpool.Pool) {
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	x := dedup.Key{EventID: uuid.New(), Handler: "a"}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	_, err = dedup.LookupClaim(ctx, tx, schema, "kafka", "", []dedup.Key{x}, nil)
	if err == nil || !strings.Contains(err.Error(), "needs READ COMMITTED") {
		t.Errorf("lookup claim in REPEATABLE READ: %v", err)
	}
	if savepointOpen(t, tx) {
		t.Error("a savepoint onceflow_claim is open after the REPEATABLE READ error")
	}
	_ = tx.Rollback(ctx)

	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{schema, "processed_events_slices"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	_, err = dedup.LookupClaim(ctx, tx, schema, "kafka", "", []dedup.Key{x}, nil)
	if err == nil || !strings.Contains(err.Error(), "is empty (was it migrated?)") {
		t.Errorf("lookup claim with no slices: %v, want an error naming the empty slices table", err)
	}
	if savepointOpen(t, tx) {
		t.Error("a savepoint onceflow_claim is open after the empty-slices error")
	}
}

// A LookupClaim that times out waiting for the slice lock (a rotation
// holds it) returns the timeout.
func TestLookupClaimLockTimeout(t *testing.T) {
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) { lookupClaimLockTimeout(t, sinktest.ModePool(t, mode)) })
	}
}

func lookupClaimLockTimeout(t *testing.T, pool *pgxpool.Pool) {
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	rot, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rot.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if _, err := rot.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "onceflow.dedup.slices:"+schema); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = 50`); err != nil {
		t.Fatal(err)
	}
	_, err = dedup.LookupClaim(ctx, tx, schema, "kafka", "", []dedup.Key{{EventID: uuid.New(), Handler: "a"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "lock timeout") {
		t.Errorf("lookup claim while the slice lock is held: %v, want the lock timeout", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rollback after the timeout: %v", err)
	}
}

// ClaimHeld, in a transaction that looked its keys up and holds them,
// claims the first copy of each key no row holds, in every query exec
// mode, and not a key claimed before (committed, or earlier in the
// transaction); the digests are stored with the claims.
func TestClaimHeld(t *testing.T) {
	base := sinktest.Pool(t)
	schema := sinktest.Schema(t, base)
	processed := pgx.Identifier{schema, "processed_events"}.Sanitize()
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			pool := sinktest.ModePool(t, mode)
			old := dedup.Key{EventID: uuid.New(), Handler: "a"}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{old}, nil)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			x := dedup.Key{EventID: uuid.New(), Handler: "a"}
			y := dedup.Key{EventID: uuid.New(), Handler: "b"}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
			held := []dedup.Key{old, x, y}
			c, err := dedup.LookupClaim(ctx, tx, schema, "kafka", "", held, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := dedup.Unclaim(ctx, tx, processed, []dedup.Key{x, y}); err != nil {
				t.Fatal(err)
			}
			dx := dedup.PayloadDigest([]byte(`{"x":1}`))
			got, err := dedup.ClaimHeld(ctx, tx, schema, "kafka", "", c.Slice, []dedup.Key{x, old, x}, []dedup.Digest{dx, {}, dx})
			if err != nil {
				t.Fatal(err)
			}
			if want := []bool{true, false, false}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("ClaimHeld(x, old, x) = %v, want %v", got, want)
			}
			got, err = dedup.ClaimHeld(ctx, tx, schema, "kafka", "", c.Slice, []dedup.Key{y, x}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := []bool{true, false}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("ClaimHeld(y, x) = %v, want %v", got, want)
			}
			found, stored, err := dedup.Lookup(ctx, tx, processed, []dedup.Key{x})
			if err != nil || !found[0] || stored[0] != dx {
				t.Errorf("x after ClaimHeld: found %v, digest %x, err %v; want found with %x", found, stored, err, dx)
			}
		})
	}
}

// Transactions claiming overlapping keys at once, each batch in its own
// order, by insert only, and by COPY and by insert mixed: every key is
// claimed exactly once, the table holds exactly the keys reported
// claimed, and no claim fails (no deadlock: every writer takes its keys'
// locks in (event_id, handler) order).
func TestLookupClaimConcurrentOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim func(worker, round int) int // the index in lookupClaims
	}{
		{"insert", func(int, int) int { return 1 }},
		{"mixed", func(w, round int) int { return (w + round) % 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) { lookupClaimConcurrentOnce(t, tc.claim) })
	}
}

func lookupClaimConcurrentOnce(t *testing.T, pick func(worker, round int) int) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	const workers, rounds, batch = 4, 6, 300
	shared := make([]dedup.Key, 800)
	for i := range shared {
		shared[i] = dedup.Key{EventID: uuid.New(), Handler: []string{"a", "b"}[i%2]}
	}
	var mu sync.Mutex
	claimedBy := map[dedup.Key]int{}
	picked := map[dedup.Key]bool{}
	contended := 0
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 34))
			for round := range rounds {
				keys := make([]dedup.Key, batch)
				for i := range keys {
					keys[i] = shared[r.IntN(len(shared))]
				}
				claim := lookupClaims[pick(w, round)].claim
				var c dedup.Claims
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					c, err = claim(ctx, tx, schema, "kafka", "", keys, nil)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("worker %d, round %d: %w", w, round, err)
					return
				}
				mu.Lock()
				if c.Contended {
					contended++
				}
				for i, won := range c.Claimed {
					picked[keys[i]] = true
					if won {
						claimedBy[keys[i]]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k := range picked {
		if n := claimedBy[k]; n != 1 {
			t.Errorf("key %v claimed %d times, want once", k, n)
		}
	}
	t.Logf("%d of %d claims contended", contended, workers*rounds)
	rows, err := pool.Query(ctx, `SELECT event_id, handler FROM `+pgx.Identifier{schema, "processed_events"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	var handler string
	inTable := map[dedup.Key]bool{}
	if _, err := pgx.ForEachRow(rows, []any{&id, &handler}, func() error {
		inTable[dedup.Key{EventID: id, Handler: handler}] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for k := range inTable {
		if claimedBy[k] == 0 {
			t.Errorf("key %v in processed_events, reported claimed by no transaction", k)
		}
	}
	for k := range claimedBy {
		if !inTable[k] {
			t.Errorf("key %v reported claimed, not in processed_events", k)
		}
	}
}
