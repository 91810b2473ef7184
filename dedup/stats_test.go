package dedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// noAnalyze is a pool on which ANALYZE fails, as a statement timeout or a
// lock would make it.
type noAnalyze struct{ *pgxpool.Pool }

func (q noAnalyze) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.HasPrefix(sql, "ANALYZE") {
		return pgconn.CommandTag{}, errors.New("canceling statement due to statement timeout")
	}
	return q.Pool.Exec(ctx, sql, args...)
}

// Ensure analyzes a slice once it holds three times ANALYZE's sample, and
// gives a slice it cannot analyze up after MaxAnalyzeTries failed tries
// rather than trying again after every batch for ever.
func TestStatisticsAnalyzeOrGiveUp(t *testing.T) {
	pool, schema, slice := quietSlice(t)
	ctx := t.Context()
	s := dedup.NewStatistics(schema, nil)
	if err := s.Ensure(ctx, pool, 0); err != nil || s.Done(0) {
		t.Fatalf("an empty slice: Ensure = %v, done %v; want nil, not done (too few rows to sample)", err, s.Done(0))
	}
	fillSlice(t, pool, slice)

	failing := dedup.NewStatistics(schema, nil)
	var errs []error
	for deadline := time.Now().Add(20 * time.Second); len(errs) < dedup.MaxAnalyzeTries; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d failed tries in 20 s, want %d", len(errs), dedup.MaxAnalyzeTries)
		}
		if err := failing.Ensure(ctx, noAnalyze{pool}, 0); err != nil {
			errs = append(errs, err)
			if done := failing.Done(0); done != (len(errs) == dedup.MaxAnalyzeTries) {
				t.Fatalf("after %d failed tries: done %v", len(errs), done)
			}
		}
	}
	if !strings.Contains(errs[len(errs)-1].Error(), "given up") {
		t.Errorf("the last try's error %q does not say the slice was given up", errs[len(errs)-1])
	}

	ensureAnalyzed(t, pool, s, schema)
}

// quietSlice returns a pool, a schema of onceflow's tables and its dedup
// slice 0 (quoted), which autovacuum leaves alone.
func quietSlice(t *testing.T) (*pgxpool.Pool, string, string) {
	t.Helper()
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	slice := pgx.Identifier{schema, "processed_events_s0"}.Sanitize()
	if _, err := pool.Exec(t.Context(), `ALTER TABLE `+slice+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	return pool, schema, slice
}

// fillSlice inserts 100 000 claims into slice: more than three times
// what ANALYZE samples.
func fillSlice(t *testing.T, pool *pgxpool.Pool, slice string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+slice+` (event_id, handler, bus, slice)
SELECT gen_random_uuid(), h, 'kafka', 0 FROM generate_series(1, 25000), unnest(ARRAY['a', 'b', 'c', 'd']) h`); err != nil {
		t.Fatal(err)
	}
}

// ensureAnalyzed calls s.Ensure until slice 0 is done, then checks that
// it has statistics of event_id.
func ensureAnalyzed(t *testing.T, pool *pgxpool.Pool, s *dedup.Statistics, schema string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !s.Done(0); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a slice of 100 000 claims was not analyzed in 20 s")
		}
		if err := s.Ensure(t.Context(), pool, 0); err != nil {
			t.Fatal(err)
		}
	}
	if sinktest.Count(t, pool, `SELECT count(*) FROM pg_stats WHERE schemaname = $1 AND tablename = 'processed_events_s0' AND attname = 'event_id'`, schema) != 1 {
		t.Error("done, and the slice has no statistics of event_id")
	}
}

// While another session holds the slice as an ANALYZE does (another
// member's, autovacuum's), Ensure's ANALYZE skips it: that is no failed
// try and no error, however long it lasts; once the lock is gone, Ensure
// analyzes it.
func TestStatisticsWaitsForAnotherAnalyze(t *testing.T) {
	pool, schema, slice := quietSlice(t)
	ctx := t.Context()
	fillSlice(t, pool, slice)
	// The server's row count, which Ensure reads, comes a moment late.
	for deadline := time.Now().Add(20 * time.Second); sinktest.Count(t, pool, `SELECT count(*) FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = 'processed_events_s0' AND n_live_tup >= 90000`, schema) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server did not count the slice's rows in 20 s")
		}
	}
	s := dedup.NewStatistics(schema, nil)
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(context.Background()) //nolint:errcheck // rolled back below
	if _, err := hold.Exec(ctx, `LOCK TABLE `+slice+` IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for check := range dedup.MaxAnalyzeTries + 1 {
		if err := s.Ensure(ctx, pool, 0); err != nil {
			t.Fatalf("check %d, while another session holds the slice: %v; want no error", check+1, err)
		}
		if s.Done(0) {
			t.Fatalf("check %d: done while another session holds the slice (no statistics)", check+1)
		}
		time.Sleep(1100 * time.Millisecond) // Ensure checks a slice once a second
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	ensureAnalyzed(t, pool, s, schema)
}
