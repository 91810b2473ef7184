package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/sink"
)

// baseline writes the unique events' effects directly: the handlers over
// batches of at most batch events of one partition (each event with its
// first delivery's partition and offset, as a member would see it), in
// offset order, one transaction each, on workers writers at
// once (the benchmark's pool size: what the members share), no Kafka, no
// duplicates, no offsets. With claims, each batch also copies its
// processed_events rows (one per event and handler) by binary COPY into
// the current dedup slice: the raw-copy baseline, what a writer of the
// same rows by the cheapest path pays for the dedup rows. Handlers that
// implement sink.TopicFilter get the events of their topic only; parse,
// if set, sets each event's Parsed as the Writer would.
func baseline(ctx context.Context, pool *pgxpool.Pool, schema string, hs []sink.Handler, evs []sink.Event,
	batch, workers int, claims bool, parse func(sink.Event) (any, error)) error {
	if parse != nil {
		cp := make([]sink.Event, len(evs))
		for i, e := range evs {
			p, err := parse(e)
			if err != nil {
				return fmt.Errorf("parse event %s: %w", e.ID, err)
			}
			e.Parsed = p
			cp[i] = e
		}
		evs = cp
	}
	var slice int32
	processed := pgx.Identifier{schema, "processed_events"}
	if claims {
		if err := pool.QueryRow(ctx, `SELECT max(slice) FROM `+pgx.Identifier{schema, "processed_events_slices"}.Sanitize()).Scan(&slice); err != nil {
			return fmt.Errorf("the current dedup slice: %w", err)
		}
		processed = pgx.Identifier{schema, fmt.Sprintf("processed_events_s%d", slice)}
	}
	write := func(ctx context.Context, b []sink.Event) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if claims {
			rows := make([][]any, 0, len(b)*len(hs))
			for _, e := range b {
				for _, h := range hs {
					if consumes(h, e.Topic) {
						rows = append(rows, []any{e.ID, h.Name(), "kafka", slice})
					}
				}
			}
			if _, err := tx.CopyFrom(ctx, processed, []string{"event_id", "handler", "bus", "slice"}, pgx.CopyFromRows(rows)); err != nil {
				return fmt.Errorf("copy processed_events: %w", err)
			}
		}
		for _, h := range hs {
			if !consumes(h, b[0].Topic) {
				continue
			}
			if err := h.Apply(ctx, tx, b); err != nil {
				return fmt.Errorf("handler %s: %w", h.Name(), err)
			}
		}
		return tx.Commit(ctx)
	}
	// A transient error (a deadlock between writers upserting the same
	// rows, a serialization failure) is retried, as the pipeline retries
	// it: up to 5 attempts, 100 ms apart.
	write1 := write
	write = func(ctx context.Context, b []sink.Event) error {
		var err error
		for range 5 {
			if err = write1(ctx, b); err == nil || !sink.IsTransient(err) {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		return err
	}
	jobs := make(chan []sink.Event) // unbuffered: a worker takes the next batch when free
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range jobs {
				if err := write(ctx, b); err != nil {
					errs[w] = err
					cancel()
					for range jobs { // drain: the feeder stops at cancel
					}
					return
				}
			}
		}()
	}
	byPart := slices.Clone(evs)
	slices.SortStableFunc(byPart, func(a, b sink.Event) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
feed:
	for i := 0; i < len(byPart); {
		j := i + 1
		for j < len(byPart) && j-i < batch && byPart[j].Partition == byPart[i].Partition {
			j++
		}
		select {
		case jobs <- byPart[i:j]:
		case <-ctx.Done():
			break feed
		}
		i = j
	}
	close(jobs)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// consumes says whether h applies events of topic.
func consumes(h sink.Handler, topic string) bool {
	f, ok := h.(sink.TopicFilter)
	return !ok || f.Consumes(topic)
}
