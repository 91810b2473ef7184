package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
)

// prefillBus marks the pre-filled processed_events rows, so that the
// check can leave them out.
const prefillBus = "prefill"

// Prefill is what prefill wrote.
type Prefill struct {
	Rows   int64  `json:"rows"`   // processed_events rows
	Events int64  `json:"events"` // events behind them (rows / handlers)
	Emails int64  `json:"emails"` // emails_sent rows (when emailHandler runs)
	IDs    string `json:"ids"`    // v4 (random) or v7 (time-ordered)
	// IndexFillfactor is the fillfactor the event_id indexes were built
	// with (then reset to the default for the run's own splits).
	IndexFillfactor int     `json:"index_fillfactor"`
	Seconds         float64 `json:"seconds"` // inserting, indexing and vacuuming
	// Older says the pre-fill is an older dedup slice: the run claims
	// into a new one (slice 1) and probes the pre-fill.
	Older bool `json:"older_slice"`
	// Warmed says the pre-fill's indexes were read before the run, so
	// that it starts with them cached as far as shared_buffers holds them
	// (see warm), in WarmSeconds.
	Warmed      bool    `json:"warmed"`
	WarmSeconds float64 `json:"warm_seconds"`
	// MaxEmailID is the largest emails_sent id written by the pre-fill:
	// the run's rows have larger ones.
	MaxEmailID int64 `json:"max_email_id"`
}

// prefillChunk is the events inserted per statement (progress is logged
// per chunk).
const prefillChunk = 1_000_000

// prefill fills e's processed_events with rows events × handlers rows
// (one per event and handler, bus "prefill") and, when emailHandler is
// among the handlers, emails_sent with one row per event, the way a
// pipeline that has run for a while has them. The counter tables are left
// alone: their size is bounded by their keys, not by time.
//
// Rows are generated in Postgres (generate_series) with the indexes
// dropped, then indexed in one sort and vacuumed, so that the run starts
// on all-visible pages with fresh statistics. A sorted build packs btree
// leaves to the index's fillfactor; an index grown by inserts of random
// ids has its leaves about 70% full (a split leaves two halves), one
// grown at its right edge (time-ordered ids) about 90%. The pre-fill
// builds the event_id indexes at fillfactor (70 for v4, 90 for v7 when
// 0), so that the run splits pages about as often as on a table that
// grew by itself, then resets the option to the index's default.
//
// ids "v7" makes the ids time-ordered (UUIDv7, one per millisecond
// ending now), "v4" random.
func prefill(ctx context.Context, e *env, o backlogOptions) (Prefill, error) {
	handlers, rows, ids, fillfactor := o.handlers, o.prefill, o.ids, o.fillfactor
	if rows <= 0 {
		return Prefill{IDs: ids}, nil
	}
	if fillfactor == 0 {
		fillfactor = 70
		if ids == "v7" {
			fillfactor = 90
		}
	}
	p := Prefill{IDs: ids, IndexFillfactor: fillfactor, Older: o.older}
	hs := int64(len(handlers))
	p.Events = (rows + hs - 1) / hs
	p.Rows = p.Events * hs
	email := slices.Contains(handlers, orders.Email)
	// The rows go into slice 0, the current one of a new schema, detached
	// while it is filled and indexed (see dedup.Retention).
	parent := pgx.Identifier{e.schema, "processed_events"}.Sanitize()
	processed := pgx.Identifier{e.schema, "processed_events_s0"}.Sanitize()
	emails := pgx.Identifier{e.schema, "emails_sent"}.Sanitize()
	start := time.Now()
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return p, err
	}
	defer conn.Release()
	exec := func(sql string, args ...any) error {
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("prefill: %s: %w", firstLine(sql), err)
		}
		return nil
	}
	if err := exec(`SET maintenance_work_mem = '1GB'`); err != nil {
		return p, err
	}
	if err := exec(`ALTER TABLE ` + parent + ` DETACH PARTITION ` + processed); err != nil {
		return p, err
	}
	if err := exec(`ALTER TABLE ` + processed + ` DROP CONSTRAINT processed_events_s0_pkey`); err != nil {
		return p, err
	}
	if err := exec(`DROP INDEX ` + pgx.Identifier{e.schema, "emails_sent_event_id"}.Sanitize()); err != nil {
		return p, err
	}
	// v7: 48 bits of milliseconds, one per event, the last one now.
	baseMs := time.Now().UnixMilli() - p.Events
	insert := `WITH g AS MATERIALIZED (
	SELECT i, CASE WHEN $4 THEN (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 16))::uuid ELSE r::uuid END AS id
	FROM (SELECT i, lpad(to_hex($5::bigint + i), 12, '0') AS h, gen_random_uuid()::text AS r
	      FROM generate_series($1::bigint, $2::bigint) AS i) AS s
), e AS (
	INSERT INTO ` + emails + ` (event_id, user_id, subject)
	SELECT id, 1 + i % 1000, 'Order confirmation: 1 item(s)' FROM g WHERE $6
)
INSERT INTO ` + processed + ` (event_id, handler, bus)
SELECT g.id, h, '` + prefillBus + `' FROM g CROSS JOIN unnest($3::text[]) AS h`
	for from := int64(1); from <= p.Events; from += prefillChunk {
		to := min(from+prefillChunk-1, p.Events)
		if err := exec(insert, from, to, handlers, ids == "v7", baseMs, email); err != nil {
			return p, err
		}
		progress("prefill: %d/%d events (%d rows) in %.0fs", to, p.Events, to*hs, time.Since(start).Seconds())
	}
	progress("prefill: building indexes")
	pkey := pgx.Identifier{e.schema, "processed_events_s0_pkey"}.Sanitize()
	emailsIdx := pgx.Identifier{e.schema, "emails_sent_event_id"}.Sanitize()
	ff := fmt.Sprintf(" WITH (fillfactor = %d)", fillfactor)
	for _, sql := range []string{
		`ALTER TABLE ` + processed + ` ADD CONSTRAINT processed_events_s0_pkey PRIMARY KEY (event_id, handler, slice)` + ff,
		`ALTER TABLE ` + parent + ` ATTACH PARTITION ` + processed + ` FOR VALUES IN (0)`,
		`CREATE INDEX emails_sent_event_id ON ` + emails + ` (event_id)` + ff,
		`ALTER INDEX ` + pkey + ` RESET (fillfactor)`,
		`ALTER INDEX ` + emailsIdx + ` RESET (fillfactor)`,
	} {
		if err := exec(sql); err != nil {
			return p, err
		}
	}
	progress("prefill: vacuum analyze")
	for _, t := range []string{processed, emails} {
		if err := exec(`VACUUM (ANALYZE) ` + t); err != nil {
			return p, err
		}
	}
	// The pre-fill's dirty pages are written now rather than by a
	// checkpoint in the middle of the run; only a superuser or
	// pg_checkpoint may, so a refusal is only reported.
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		progress("prefill: CHECKPOINT refused (%v): the next checkpoint writes the pre-fill during the run", err)
	}
	if o.older {
		if err := olderSlice(ctx, e); err != nil {
			return p, err
		}
	}
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(id), 0), count(*) FROM `+emails).Scan(&p.MaxEmailID, &p.Emails); err != nil {
		return p, fmt.Errorf("prefill: count emails_sent: %w", err)
	}
	if o.warm {
		if p.WarmSeconds, err = warm(ctx, conn.Conn(), processed, email, emails); err != nil {
			return p, err
		}
		p.Warmed = true
	}
	p.Seconds = time.Since(start).Seconds()
	progress("prefill: %d rows in %.0fs", p.Rows, p.Seconds)
	return p, nil
}

// timeOrdered replaces each event's id in s by a UUIDv7 drawn in the
// order of the event's first message, as a producer stamping ids at
// creation would; redeliveries keep their event's new id.
func timeOrdered(s orders.Stream) (orders.Stream, error) {
	ids := make(map[uuid.UUID]uuid.UUID, len(s.Unique))
	out := orders.Stream{Messages: make([]orders.Message, len(s.Messages)), Unique: make(map[uuid.UUID]orders.Order, len(s.Unique))}
	for i, m := range s.Messages {
		id, ok := ids[m.ID]
		if !ok {
			var err error
			if id, err = uuid.NewV7(); err != nil {
				return orders.Stream{}, err
			}
			ids[m.ID] = id
			out.Unique[id] = s.Unique[m.ID]
		}
		out.Messages[i] = orders.Message{ID: id, Value: m.Value}
	}
	return out, nil
}

func firstLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

// olderSlice makes slice 0 (the pre-fill) an older slice by starting slice
// 1, as dedup.Retention does a day after slice 0 began with 24 slices to
// a week: claims then write into slice 1 and probe slice 0.
func olderSlice(ctx context.Context, e *env) error {
	list := pgx.Identifier{e.schema, "processed_events_slices"}.Sanitize()
	if _, err := e.pool.Exec(ctx, `UPDATE `+list+` SET started_at = now() - interval '1 day' WHERE slice = 0`); err != nil {
		return fmt.Errorf("prefill: age slice 0: %w", err)
	}
	r := dedup.Retention{Pool: e.pool, Schema: e.schema, Horizon: 7 * 24 * time.Hour, Slices: 24}
	if _, err := r.Step(ctx); err != nil {
		return fmt.Errorf("prefill: start slice 1: %w", err)
	}
	var current int32
	if err := e.pool.QueryRow(ctx, `SELECT max(slice) FROM `+list).Scan(&current); err != nil || current != 1 {
		return fmt.Errorf("prefill: start slice 1: current slice %d (%v)", current, err)
	}
	progress("prefill: slice 1 started; the pre-fill is the older slice 0")
	return nil
}

// warm reads the indexes every new event touches at a random place — the
// pre-filled slice's primary key (claims probe it) and emails_sent's
// event_id index (each email inserts into it) — by index-only scans in key
// order, which go through shared_buffers (a sequential scan would use a
// small ring). A pipeline that has run a while has these pages cached as
// far as shared_buffers holds them; a run that started on a cold cache
// would measure the warm-up instead, which on 50 M rows lasts minutes.
func warm(ctx context.Context, conn *pgx.Conn, processed string, email bool, emails string) (float64, error) {
	start := time.Now()
	progress("prefill: reading the indexes into shared_buffers")
	stmts := []string{`SET enable_seqscan = off`, `SET enable_bitmapscan = off`, `SET enable_sort = off`,
		`SELECT count(*) FROM (SELECT event_id, handler, slice FROM ` + processed + ` ORDER BY event_id, handler, slice) AS k`}
	if email {
		stmts = append(stmts, `SELECT count(*) FROM (SELECT event_id FROM `+emails+` ORDER BY event_id) AS k`)
	}
	stmts = append(stmts, `RESET enable_seqscan`, `RESET enable_bitmapscan`, `RESET enable_sort`)
	for _, sql := range stmts {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return 0, fmt.Errorf("prefill: warm: %s: %w", sql, err)
		}
	}
	return time.Since(start).Seconds(), nil
}
