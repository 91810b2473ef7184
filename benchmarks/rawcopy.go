package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/sink"
)

// rawCopy is what Postgres can write for the same effects by the cheapest
// path: the unique events only (no duplicates, no dedup, no Kafka, no
// offsets), one processed_events row per (event, handler) and the
// emails_sent rows by binary COPY, the counters by the handlers' own
// set-based upserts, -batch events per transaction, two connections each
// owning half the partitions — the same split as the ceiling. The
// scenarios' ratios to it say how close onceflow is to the hardware.
func (b *bench) rawCopy(ctx context.Context) (*Run, error) {
	stream, err := orders.Generate(b.o.events, b.o.duplicates, b.o.seed)
	if err != nil {
		return nil, err
	}
	e, err := b.newEnv(ctx, "raw-copy")
	if err != nil {
		return nil, err
	}
	defer e.close()
	hs, err := orders.Handlers(e.schema, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	type event struct {
		ev    sink.Event
		order orders.Order
	}
	parts := make([][]event, b.o.partitions)
	seen := make(map[uuid.UUID]bool, len(stream.Unique))
	for _, m := range stream.Messages {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		o, err := orders.Parse(m.Value)
		if err != nil {
			return nil, err
		}
		h := fnv.New32a()
		_, _ = h.Write(m.ID[:])
		p := int(h.Sum32() % uint32(b.o.partitions))
		parts[p] = append(parts[p], event{sink.Event{ID: m.ID, Value: m.Value, Topic: e.topic, Partition: int32(p),
			Offset: int64(len(parts[p]))}, o})
	}
	progress("raw-copy: %d unique events by COPY and set-based upserts, no dedup, no Kafka", len(stream.Unique))
	r := &Run{Name: "raw-copy", Kind: "baseline", Records: len(stream.Unique), UniqueEvents: len(stream.Unique)}
	processed := pgx.Identifier{e.schema, "processed_events"}
	emails := pgx.Identifier{e.schema, "emails_sent"}
	write := func(ctx context.Context, batch []event) error {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows := make([][]any, 0, len(batch)*len(hs))
		for _, x := range batch {
			for _, h := range hs {
				rows = append(rows, []any{x.ev.ID, h.Name(), "kafka"})
			}
		}
		if _, err := tx.CopyFrom(ctx, processed, []string{"event_id", "handler", "bus"}, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("copy processed_events: %w", err)
		}
		evs := make([]sink.Event, len(batch))
		for i, x := range batch {
			evs[i] = x.ev
		}
		for _, h := range hs {
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
	}
	var mu sync.Mutex
	var durs []time.Duration
	resetPeakRSS()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for worker := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := worker; p < len(parts); p += 2 {
				for i := 0; i < len(parts[p]); i += b.o.batch {
					t := time.Now()
					if err := write(ctx, parts[p][i:min(i+b.o.batch, len(parts[p]))]); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					durs = append(durs, time.Since(t))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	r.Seconds = time.Since(start).Seconds()
	r.UniqueEventsPerSec = float64(r.UniqueEvents) / r.Seconds
	r.RecordsPerSec = float64(r.Records) / r.Seconds
	r.RecordsConsumed = int64(r.Records)
	r.BatchP50Ms, r.BatchP99Ms = percentileMs(durs, 0.5), percentileMs(durs, 0.99)
	r.PeakRSSMiB = peakRSSMiB()
	rep, err := orders.Check(ctx, e.pool, e.schema, stream.Unique, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	r.ExactlyOnce, r.Problems = rep.ExactlyOnce(), nonNil(rep.Problems)
	progress("raw-copy: %.0f events/s; effects as expected: %v", r.UniqueEventsPerSec, r.ExactlyOnce)
	return r, nil
}
