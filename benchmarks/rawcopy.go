package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
)

// rawCopy is what Postgres can write for the same effects by the cheapest
// path: the unique events only (no duplicates, no dedup, no Kafka, no
// offsets), one processed_events row per (event, handler) and the
// emails_sent rows by binary COPY, the counters by the handlers' own
// set-based upserts, -batch events per transaction, on the -pool
// connections the scenarios' members share — the same split as the
// ceiling. The scenarios' ratios to it say how close onceflow is to the
// hardware.
func (b *bench) rawCopy(ctx context.Context) (*Run, error) {
	d, err := b.direct(ctx, "raw-copy", true)
	if err != nil {
		return nil, err
	}
	defer d.e.close()
	progress("raw-copy: %d unique events by COPY and set-based upserts, no dedup, no Kafka", len(d.stream.Unique))
	write, err := d.rawCopyWrite(ctx, "kafka")
	if err != nil {
		return nil, err
	}
	r, err := d.run(ctx, "raw-copy", write)
	if err != nil {
		return nil, err
	}
	progress("raw-copy: %.0f events/s; effects as expected: %v", r.UniqueEventsPerSec, r.ExactlyOnce)
	return r, nil
}

// rawCopyWrite returns the writer of one batch of the raw-copy baseline:
// processed_events rows (with bus) into the current dedup slice, as claims
// write them, and emails_sent rows by binary COPY, the other handlers'
// effects by their set-based upserts, in one transaction.
func (d *directRun) rawCopyWrite(ctx context.Context, bus string) (func(ctx context.Context, _ int, batch []event) error, error) {
	var slice int32
	if err := d.e.pool.QueryRow(ctx, `SELECT max(slice) FROM `+pgx.Identifier{d.e.schema, "processed_events_slices"}.Sanitize()).Scan(&slice); err != nil {
		return nil, fmt.Errorf("raw-copy: the current dedup slice: %w", err)
	}
	processed := pgx.Identifier{d.e.schema, fmt.Sprintf("processed_events_s%d", slice)}
	emails := pgx.Identifier{d.e.schema, "emails_sent"}
	return func(ctx context.Context, _ int, batch []event) error {
		tx, err := d.e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows := make([][]any, 0, len(batch)*len(d.hs))
		for _, x := range batch {
			for _, h := range d.hs {
				rows = append(rows, []any{x.ev.ID, h.Name(), bus, slice})
			}
		}
		if _, err := tx.CopyFrom(ctx, processed, []string{"event_id", "handler", "bus", "slice"}, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("copy processed_events: %w", err)
		}
		evs := make([]sink.Event, len(batch))
		for i, x := range batch {
			evs[i] = x.ev
		}
		for _, h := range d.hs {
			if h.Name() != "emailHandler" {
				if err := h.Apply(ctx, tx, evs); err != nil {
					return fmt.Errorf("%s: %w", h.Name(), err)
				}
				continue
			}
			rows := make([][]any, len(batch))
			for i, x := range batch {
				rows[i] = []any{x.ev.ID, x.order.UserID, orders.Subject(x.order)}
			}
			if _, err := tx.CopyFrom(ctx, emails, []string{"event_id", "user_id", "subject"}, pgx.CopyFromRows(rows)); err != nil {
				return fmt.Errorf("copy emails_sent: %w", err)
			}
		}
		return tx.Commit(ctx)
	}, nil
}
