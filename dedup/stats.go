package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Statistics gives the slice that claims go to its planner statistics
// once it holds enough claims to sample.
//
// A slice starts with none: the migration creates slice 0 empty, and each
// rotation the next one. Autovacuum analyzes a table only on its next pass
// over the database (autovacuum_naptime: a minute by default, later on a
// busy server), and a slice that takes tens of thousands of claims a
// second holds millions of rows by then. Until then the planner does not
// know how many rows an event id matches (it assumes one in 200 of the
// slice), takes a batch's look-up of a thousand ids for one that reads
// nearly every row, and scans the whole slice instead of probing its
// primary key, on every custom plan: the first five executions of the
// look-up on each connection, so on every member that joins and every
// connection a pool opens. Analyzed, the slice keeps a distinct count
// that grows with it (ANALYZE stores it as a fraction of the rows while
// the ids are more than a tenth of them, that is while events have fewer
// than ten handlers), and look-ups use the primary key however large it
// grows; the ANALYZE also drops the plans cached before it.
//
// It is analyzed once it holds three times the rows ANALYZE samples (300
// times the statistics target: 90 000 rows by default), not at its first
// claims: an ANALYZE that samples every row takes each event id of a
// multi-handler slice for a most common value, one that stays "half a
// percent of the slice" as the slice grows, and a look-up of such ids
// scans it again. Until then the look-ups' scans are of a small slice.
//
// ANALYZE needs the table's owner (or the database's, or, from
// PostgreSQL 17, the MAINTAIN privilege); as any other role it analyzes
// nothing, and Ensure gives the slice up with a warning. It runs with
// SKIP_LOCKED: while another member's ANALYZE, or autovacuum's, holds the
// slice, it waits for none of them, and looks again a second later.
//
// Statistics is safe for concurrent use. Create it with NewStatistics.
type Statistics struct {
	t     tables
	log   *slog.Logger
	every time.Duration // between two checks of one slice
	// under mu, held by the one caller that checks (the others go on):
	mu      sync.Mutex
	checked time.Time // the last check
	slice   int32     // the slice tries counts the failed tries of
	tries   int
	next    atomic.Int64 // every slice below it has been seen to
}

// MaxAnalyzeTries is how many times Ensure tries to analyze a slice (an
// error, or an ANALYZE after which the slice still has no statistics)
// before it leaves the slice to autovacuum.
const MaxAnalyzeTries = 3

// NewStatistics returns a Statistics for the tables in schema; log may be
// nil.
func NewStatistics(schema string, log *slog.Logger) *Statistics {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Statistics{t: tablesOf(schema), log: log, every: time.Second}
}

// Done reports whether slice has been seen to; it does no I/O.
func (s *Statistics) Done(slice int32) bool { return int64(slice) < s.next.Load() }

// Ensure sees to slice's statistics: it does nothing when the slice has
// some, or holds too few rows yet (see Statistics), and analyzes it
// otherwise. Call it after a COMMIT that claimed keys into slice (the
// current one), outside any transaction; ctx bounds it. It checks at most
// once a second (one query); calls for a slice seen to, calls within the
// second, and calls while another one checks, return at once. A failed
// try (an error, or no statistics after the ANALYZE) leaves the slice to a
// later call, up to MaxAnalyzeTries tries; the error is returned, after
// the last try with the slice given up. An ANALYZE skipped for another
// session's lock on the slice is no try and no error: a later call looks
// again.
func (s *Statistics) Ensure(ctx context.Context, q Querier, slice int32) error {
	if s.Done(slice) || !s.mu.TryLock() {
		return nil
	}
	defer s.mu.Unlock()
	if s.Done(slice) || time.Since(s.checked) < s.every {
		return nil
	}
	s.checked = time.Now()
	if slice != s.slice {
		s.slice, s.tries = slice, 0
	}
	st, err := s.read(ctx, q, slice)
	if err == nil && !st.has {
		if st.rows < 3*st.sample {
			return nil
		}
		st, err = s.analyze(ctx, q, slice)
		if err == nil && !st.has {
			// SKIP_LOCKED skipped it for another session's lock (another
			// member's ANALYZE, autovacuum's): not a try; a second later
			// it has statistics, or is free.
			var held bool
			if held, err = s.heldByAnother(ctx, q, slice); err == nil && held {
				return nil
			}
		}
	}
	if err == nil && !st.has {
		err = fmt.Errorf("%s has no planner statistics after ANALYZE (only its owner, or the database's, can analyze it)", sliceName(slice))
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return err // the caller gave up (a revoke, a shutdown): not a try
		}
		if s.tries++; s.tries < MaxAnalyzeTries {
			return err
		}
		s.log.Warn("a new dedup slice has no planner statistics and onceflow gives up analyzing it: until autovacuum "+
			"does, the first look-ups on each new connection scan the whole slice", "slice", sliceName(slice),
			"tries", s.tries, "err", err)
		err = fmt.Errorf("%w (given up after %d tries)", err, s.tries)
	}
	s.next.Store(int64(slice) + 1)
	return err
}

// analyze runs ANALYZE on slice, skipping it when another holds it, and
// reads its statistics again.
func (s *Statistics) analyze(ctx context.Context, q Querier, slice int32) (sliceStats, error) {
	start := time.Now()
	if _, err := q.Exec(ctx, `ANALYZE (SKIP_LOCKED) `+s.t.slice(slice)); err != nil {
		return sliceStats{}, fmt.Errorf("analyze %s: %w", sliceName(slice), err)
	}
	st, err := s.read(ctx, q, slice)
	if err == nil && st.has {
		s.log.Info("analyzed a new dedup slice, so that look-ups probe its primary key",
			"slice", sliceName(slice), "rows", st.rows, "took", time.Since(start).Round(time.Millisecond))
	}
	return st, err
}

// heldByAnother reports whether another session holds a lock on slice
// that ANALYZE waits for, which ANALYZE (SKIP_LOCKED) skips the slice for.
func (s *Statistics) heldByAnother(ctx context.Context, q Querier, slice int32) (bool, error) {
	rows, err := q.Query(ctx, `SELECT EXISTS (SELECT FROM pg_locks
WHERE locktype = 'relation' AND relation = to_regclass(format('%I.%I', $1::text, $2::text)) AND granted AND pid <> pg_backend_pid()
  AND mode IN ('ShareUpdateExclusiveLock', 'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'))`,
		s.t.schema, sliceName(slice))
	if err != nil {
		return false, fmt.Errorf("read the locks on %s: %w", sliceName(slice), err)
	}
	held, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return false, fmt.Errorf("read the locks on %s: %w", sliceName(slice), err)
	}
	return held, nil
}

// sliceStats is what Ensure reads of a slice.
type sliceStats struct {
	has    bool  // the planner has statistics of its event_id
	rows   int64 // live rows, as the server counts them (a second late at most)
	sample int64 // rows ANALYZE samples: 300 times its largest statistics target
}

func (s *Statistics) read(ctx context.Context, q Querier, slice int32) (sliceStats, error) {
	rows, err := q.Query(ctx, `SELECT
  EXISTS (SELECT FROM pg_stats WHERE schemaname = $1 AND tablename = $2 AND attname = 'event_id'),
  coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2), 0),
  300 * (SELECT max(CASE WHEN a.attstattarget > 0 THEN a.attstattarget
                         ELSE current_setting('default_statistics_target')::integer END)
         FROM pg_attribute a WHERE a.attrelid = to_regclass(format('%I.%I', $1, $2)) AND a.attnum > 0 AND NOT a.attisdropped)`,
		s.t.schema, sliceName(slice))
	if err != nil {
		return sliceStats{}, fmt.Errorf("read the statistics of %s: %w", sliceName(slice), err)
	}
	st, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (sliceStats, error) {
		var st sliceStats
		var sample *int64
		err := r.Scan(&st.has, &st.rows, &sample)
		if sample != nil {
			st.sample = *sample
		}
		return st, err
	})
	if err != nil {
		return sliceStats{}, fmt.Errorf("read the statistics of %s: %w", sliceName(slice), err)
	}
	return st, nil
}
