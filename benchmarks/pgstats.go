package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PGTable is one table of the run's schema as Postgres' statistics saw
// it at the end of a run (-spans): pg_stat_user_tables and
// pg_statio_user_tables, which need no superuser.
type PGTable struct {
	Name       string `json:"name"`
	Inserted   int64  `json:"n_tup_ins"`
	Updated    int64  `json:"n_tup_upd"`
	HotUpdated int64  `json:"n_tup_hot_upd"`
	Dead       int64  `json:"n_dead_tup"`
	HeapRead   int64  `json:"heap_blks_read"`
	HeapHit    int64  `json:"heap_blks_hit"`
	IdxRead    int64  `json:"idx_blks_read"`
	IdxHit     int64  `json:"idx_blks_hit"`
	Bytes      int64  `json:"total_bytes"`
}

// WAL is the cluster's WAL written during a run (pg_stat_wal): every
// database's, so shared with whatever else runs on the server.
type WAL struct {
	Records int64 `json:"wal_records"`
	FPI     int64 `json:"wal_fpi"`
	Bytes   int64 `json:"wal_bytes"`
}

func readWAL(ctx context.Context, pool *pgxpool.Pool) (WAL, error) {
	var w WAL
	err := pool.QueryRow(ctx, `SELECT wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal`).Scan(&w.Records, &w.FPI, &w.Bytes)
	if err != nil {
		return w, fmt.Errorf("read pg_stat_wal: %w", err)
	}
	return w, nil
}

// tableStats reads schema's tables' statistics. The pool's connections
// are closed first: a backend reports its counters on exit at the latest,
// and idle ones may hold them back for seconds.
func tableStats(ctx context.Context, pool *pgxpool.Pool, schema string) ([]PGTable, error) {
	pool.Reset()
	time.Sleep(500 * time.Millisecond) // the exiting backends report
	rows, err := pool.Query(ctx, `SELECT t.relname, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_dead_tup,
  coalesce(io.heap_blks_read, 0), coalesce(io.heap_blks_hit, 0), coalesce(io.idx_blks_read, 0), coalesce(io.idx_blks_hit, 0),
  pg_total_relation_size(t.relid)
FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
WHERE t.schemaname = $1 ORDER BY pg_total_relation_size(t.relid) DESC, t.relname`, schema)
	if err != nil {
		return nil, fmt.Errorf("read table statistics: %w", err)
	}
	var out []PGTable
	var t PGTable
	_, err = pgx.ForEachRow(rows, []any{&t.Name, &t.Inserted, &t.Updated, &t.HotUpdated, &t.Dead,
		&t.HeapRead, &t.HeapHit, &t.IdxRead, &t.IdxHit, &t.Bytes}, func() error { out = append(out, t); return nil })
	if err != nil {
		return nil, fmt.Errorf("read table statistics: %w", err)
	}
	return out, nil
}

// checkpoints returns how many checkpoints the server has begun, timed or
// requested, since its statistics were reset.
func checkpoints(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column: PostgreSQL 17 moved them
		err = pool.QueryRow(ctx, `SELECT num_timed + num_requested FROM pg_stat_checkpointer`).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("read the checkpoints begun: %w", err)
	}
	return n, nil
}

// checkpointCounted waits until the checkpoints begun exceed before — the
// checkpointer counts a requested checkpoint after the CHECKPOINT that
// asked for it has returned — and returns the new count, so that the
// harness's own checkpoint does not count as one begun during the run.
// After two seconds it takes before + 1.
func checkpointCounted(ctx context.Context, pool *pgxpool.Pool, before int64) (int64, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := checkpoints(ctx, pool)
		if err != nil || n > before {
			return n, err
		}
		if time.Now().After(deadline) {
			return before + 1, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkpoint runs CHECKPOINT, so that a run starts where every run
// starts in the server's checkpoint cycle: right after one. A run writes
// 0.5–2 GB of WAL, so with max_wal_size's default of 1 GB the server
// checkpoints during runs wherever its cycle falls, and a checkpoint
// taxes the writes after it with full-page images (every index page of a
// random uuid key touched again). Started from a checkpoint, runs of the
// same WAL meet theirs at the same places. ok is false when the role may
// not checkpoint (it needs pg_checkpoint, PostgreSQL 15+, or superuser).
func checkpoint(ctx context.Context, pool *pgxpool.Pool) (ok bool, err error) {
	_, err = pool.Exec(ctx, `CHECKPOINT`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checkpoint: %w", err)
	}
	return true, nil
}
