package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink"
)

// baseline writes the unique events' effects directly: the handlers over
// batches of at most batch events of one topic partition (each event with its
// first delivery's partition and offset, as a member would see it), in
// offset order, one transaction each, on workers writers at
// once (the benchmark's pool size: what the members share), no Kafka, no
// duplicates, no offsets. With claims, each batch also copies its
// processed_events rows (one per event and handler, the columns a claim
// writes: bus, no trace id, the payload's digest) by binary COPY into the
// current dedup slice: the raw-copy baseline, what a writer of the same
// rows by the cheapest path pays for the dedup rows. Handlers that
// implement sink.TopicFilter get the events of their topic only; parse,
// if set, sets each event's Parsed as the Writer would.
//
// The cheapest path, measured against an independent writer of the same
// rows (benchmarks/ceiling): the work is split by partition in one pass
// and each batch parsed by the writer that writes it, so the writers start
// at once and parse while others write; the dedup rows are encoded into a
// buffer each writer keeps, not built as rows of values for pgx to encode.
func baseline(ctx context.Context, pool *pgxpool.Pool, schema string, hs []sink.Handler, evs []sink.Event,
	batch, workers int, claims bool, parse func(sink.Event) (any, error)) error {
	var slice int32
	processed := pgx.Identifier{schema, "processed_events"}
	if claims {
		if err := pool.QueryRow(ctx, `SELECT max(slice) FROM `+pgx.Identifier{schema, "processed_events_slices"}.Sanitize()).Scan(&slice); err != nil {
			return fmt.Errorf("the current dedup slice: %w", err)
		}
		processed = pgx.Identifier{schema, fmt.Sprintf("processed_events_s%d", slice)}
	}
	copySQL := `COPY ` + processed.Sanitize() + ` (event_id, handler, bus, trace_id, payload_digest, slice) FROM STDIN BINARY`
	// A writer's own: the batch's events (parsed) and its encoded rows.
	type scratch struct {
		evs  []sink.Event
		rows []byte
	}
	write := func(ctx context.Context, s *scratch, b []int) error {
		s.evs = s.evs[:0]
		for _, i := range b {
			e := evs[i]
			if parse != nil {
				p, err := parse(e)
				if err != nil {
					return fmt.Errorf("parse event %s: %w", e.ID, err)
				}
				e.Parsed = p
			}
			s.evs = append(s.evs, e)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if claims {
			s.rows = appendClaimRows(s.rows[:0], hs, s.evs, slice)
			if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(s.rows), copySQL); err != nil {
				return fmt.Errorf("copy processed_events: %w", err)
			}
		}
		for _, h := range hs {
			if !consumes(h, s.evs[0].Topic) {
				continue
			}
			if err := h.Apply(ctx, tx, s.evs); err != nil {
				if we := (*WroteError)(nil); errors.As(err, &we) {
					return err // the handler is named; no event is to blame
				}
				err = fmt.Errorf("handler %s: %w", h.Name(), err)
				if sink.IsTransient(err) || ctx.Err() != nil {
					return err
				}
				_ = tx.Rollback(ctx)
				if k, ok := firstFailing(ctx, pool, h, s.evs); ok {
					return &eventError{event: b[k], payload: s.evs[k].Value, err: err}
				}
				return err
			}
		}
		return tx.Commit(ctx)
	}
	// A transient error (a deadlock between writers upserting the same
	// rows, a serialization failure) is retried, as the pipeline retries
	// it: up to 5 attempts, 100 ms apart.
	write1 := write
	write = func(ctx context.Context, s *scratch, b []int) error {
		var err error
		for range 5 {
			if err = write1(ctx, s, b); err == nil || !sink.IsTransient(err) {
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
	jobs := make(chan []int) // unbuffered: a worker takes the next batch when free
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &scratch{evs: make([]sink.Event, 0, batch)}
			for b := range jobs {
				if err := write(ctx, s, b); err != nil {
					errs[w] = err
					cancel()
					for range jobs { // drain: the feeder stops at cancel
					}
					return
				}
			}
		}()
	}
	byPart := byPartition(evs)
feed:
	for _, p := range byPart {
		for i := 0; i < len(p); i += batch {
			select {
			case jobs <- p[i:min(i+batch, len(p))]:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	// The writers stopped by the first one's failure say "context
	// canceled": the failure is said alone.
	var failed []error
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			failed = append(failed, err)
		}
	}
	if err := errors.Join(failed...); err != nil {
		return err
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// eventError is a baseline's failure that one event's payload causes:
// event is its index in the events given to baseline.
type eventError struct {
	event   int
	payload []byte
	err     error
}

func (e *eventError) Error() string { return fmt.Sprintf("event %d: %v", e.event+1, e.err) }
func (e *eventError) Unwrap() error { return e.err }

// firstFailing finds the event of evs that h fails on: the shortest
// prefix of evs that h fails to apply on a data error, found by halving,
// each attempt in a transaction rolled back; its last event's index.
// false when h applies them all now, or an attempt fails otherwise (a
// lost connection). The attempts do not end with ctx: the other writers'
// end, when another writer failed first (on the same payload, used in
// turn), cancels it, and an attempt canceled would count as failing.
func firstFailing(ctx context.Context, pool *pgxpool.Pool, h sink.Handler, evs []sink.Event) (int, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	fails := func(n int) (bool, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		err = h.Apply(ctx, tx, evs[:n])
		if err != nil && !sink.IsData(err) {
			return false, err
		}
		return err != nil, nil
	}
	if f, err := fails(len(evs)); err != nil || !f {
		return 0, false
	}
	lo, hi := 0, len(evs) // evs[:lo] applies, evs[:hi] fails
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		f, err := fails(mid)
		if err != nil {
			return 0, false
		}
		if f {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi - 1, true
}

// byPartition returns the indexes of evs by topic and partition, in offset
// order within each (one pass when evs are in offset order already, as a
// stream produced is), partitions in (topic, partition) order.
func byPartition(evs []sink.Event) [][]int {
	type tp struct {
		topic     string
		partition int32
	}
	at := map[tp]int{}
	var parts [][]int
	for i, e := range evs {
		k := tp{e.Topic, e.Partition}
		j, ok := at[k]
		if !ok {
			j = len(parts)
			at[k] = j
			parts = append(parts, nil)
		}
		parts[j] = append(parts[j], i)
	}
	byOffset := func(a, b int) int { return cmp.Compare(evs[a].Offset, evs[b].Offset) }
	for _, p := range parts {
		if !slices.IsSortedFunc(p, byOffset) {
			slices.SortStableFunc(p, byOffset)
		}
	}
	slices.SortFunc(parts, func(a, b []int) int {
		return cmp.Or(cmp.Compare(evs[a[0]].Topic, evs[b[0]].Topic), cmp.Compare(evs[a[0]].Partition, evs[b[0]].Partition))
	})
	return parts
}

// appendClaimRows appends to b, in COPY's binary format, the
// processed_events rows a claim of evs by hs writes into slice: event_id,
// handler, bus ("kafka"), trace_id (NULL), payload_digest, slice.
func appendClaimRows(b []byte, hs []sink.Handler, evs []sink.Event, slice int32) []byte {
	b = append(b, "PGCOPY\n\xff\r\n\x00"...)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, 0) // header extension length
	for _, e := range evs {
		d := dedup.PayloadDigest(e.Value)
		for _, h := range hs {
			if !consumes(h, e.Topic) {
				continue
			}
			b = binary.BigEndian.AppendUint16(b, 6)
			b = binary.BigEndian.AppendUint32(b, 16)
			b = append(b, e.ID[:]...)
			b = binary.BigEndian.AppendUint32(b, uint32(len(h.Name())))
			b = append(b, h.Name()...)
			b = binary.BigEndian.AppendUint32(b, 5)
			b = append(b, "kafka"...)
			b = binary.BigEndian.AppendUint32(b, 0xffffffff) // NULL trace_id
			b = binary.BigEndian.AppendUint32(b, uint32(len(d)))
			b = append(b, d[:]...)
			b = binary.BigEndian.AppendUint32(b, 4)
			b = binary.BigEndian.AppendUint32(b, uint32(slice))
		}
	}
	return binary.BigEndian.AppendUint16(b, 0xffff) // the end
}

// consumes says whether h applies events of topic.
func consumes(h sink.Handler, topic string) bool {
	f, ok := h.(sink.TopicFilter)
	return !ok || f.Consumes(topic)
}
