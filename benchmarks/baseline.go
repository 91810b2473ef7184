package main

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/members"
	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// baseline runs one baseline on the same generated data and handlers.
func (b *bench) baseline(ctx context.Context, name string) (*Run, error) {
	switch name {
	case "raw-copy":
		return b.rawCopy(ctx)
	case "ceiling":
		return b.ceiling(ctx)
	case "per-record-dedup":
		return b.perRecordDedup(ctx)
	case "naive-per-record":
		return b.naive(ctx)
	}
	return nil, errors.New("unknown baseline " + name)
}

// ceiling writes the scenario's stream straight through sink.Writer — the
// same claims, handler rows and offset compare-and-set, in batches of
// -batch — with no Kafka: two goroutines (one per connection pair), each
// owning half the partitions.
func (b *bench) ceiling(ctx context.Context) (*Run, error) {
	stream, err := orders.Generate(b.o.events, b.o.duplicates, b.o.seed)
	if err != nil {
		return nil, err
	}
	e, err := b.newEnv(ctx, "ceiling")
	if err != nil {
		return nil, err
	}
	defer e.close()
	hs, err := orders.Handlers(e.schema, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	w, err := sink.New(e.pool, sink.Config{Schema: e.schema, Group: e.group, Handlers: hs, Logger: b.log})
	if err != nil {
		return nil, err
	}
	parts := make([][]sink.Event, b.o.partitions)
	for _, m := range stream.Messages {
		h := fnv.New32a()
		_, _ = h.Write(m.ID[:])
		p := int(h.Sum32() % uint32(b.o.partitions))
		parts[p] = append(parts[p], sink.Event{ID: m.ID, Value: m.Value, Topic: e.topic, Partition: int32(p), Offset: int64(len(parts[p]))})
	}
	all := make([]int32, b.o.partitions)
	for p := range all {
		all[p] = int32(p)
	}
	leases, err := w.Take(ctx, e.topic, all)
	if err != nil {
		return nil, err
	}
	progress("ceiling: %d records straight into sink.Writer, no Kafka", len(stream.Messages))
	r := &Run{Name: "ceiling", Kind: "baseline", Records: len(stream.Messages), UniqueEvents: len(stream.Unique)}
	var mu sync.Mutex
	var durs []time.Duration
	var applied, skipped int64
	resetPeakRSS()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for worker := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := worker; p < len(parts); p += 2 {
				fence := int64(-1)
				evs := parts[p]
				for i := 0; i < len(evs); i += b.o.batch {
					batch := evs[i:min(i+b.o.batch, len(evs))]
					t := time.Now()
					res, err := w.Write(ctx, &sink.Batch{Topic: e.topic, Partition: int32(p), Epoch: leases[int32(p)].Epoch, Fence: fence,
						NextOffset: batch[len(batch)-1].Offset + 1, Events: batch})
					if err != nil {
						errs <- err
						return
					}
					fence = batch[len(batch)-1].Offset + 1
					mu.Lock()
					durs = append(durs, time.Since(t))
					applied += int64(res.Applied)
					skipped += int64(res.SkippedPostgres)
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
	r.RecordsConsumed, r.SkippedPostgres = int64(r.Records), skipped
	r.BatchP50Ms, r.BatchP99Ms = percentileMs(durs, 0.5), percentileMs(durs, 0.99)
	r.PeakRSSMiB = peakRSSMiB()
	rep, err := orders.Check(ctx, e.pool, e.schema, stream.Unique, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	r.ExactlyOnce, r.Problems = rep.ExactlyOnce(), nonNil(rep.Problems)
	progress("ceiling: %.0f events/s; exactly once: %v", r.UniqueEventsPerSec, r.ExactlyOnce)
	return r, nil
}

// perRecordDedup is onceflow's own pipeline with one-record batches: a
// transaction (claim, handlers, offset compare-and-set, COMMIT) per record.
func (b *bench) perRecordDedup(ctx context.Context) (*Run, error) {
	oneRecord := func(c *processor.Config) { c.BatchMaxRecords = 1 }
	return b.runGroup(ctx, "per-record-dedup", "baseline", b.o.naiveEvents, oneRecord,
		func(ctx context.Context, r *Run, _ *group, e *env, _ time.Time) error {
			return members.WaitCommitted(ctx, e.pool, e.schema, e.group, int64(r.Records), 100*time.Millisecond)
		})
}

// naive consumes with plain franz-go and writes each record's effects
// with every handler's statement autocommitted on its own: no claim, no
// offset store; Kafka offsets autocommitted every second. At-least-once,
// so every duplicate record doubles its effects — the check says so.
func (b *bench) naive(ctx context.Context) (*Run, error) {
	stream, err := orders.Generate(b.o.naiveEvents, b.o.duplicates, b.o.seed)
	if err != nil {
		return nil, err
	}
	e, err := b.newEnv(ctx, "naive-per-record")
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.preload(ctx, stream.Messages); err != nil {
		return nil, err
	}
	hs, err := orders.Handlers(e.schema, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	progress("naive-per-record: %d records, each handler's write autocommitted, no dedup", len(stream.Messages))
	r := &Run{Name: "naive-per-record", Kind: "baseline", Records: len(stream.Messages), UniqueEvents: len(stream.Unique)}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(e.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var durs []time.Duration
	resetPeakRSS()
	start := time.Now()
	n := 0
	for n < r.Records {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ferr error
		fs.EachRecord(func(rec *kgo.Record) {
			if ferr != nil {
				return
			}
			ev, err := processor.Decode(rec, processor.DecodeConfig{})
			if err != nil {
				ferr = err
				return
			}
			t := time.Now()
			for _, h := range hs {
				if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return h.Apply(ctx, tx, []sink.Event{ev}) }); err != nil {
					ferr = err
					return
				}
			}
			durs = append(durs, time.Since(t))
			n++
		})
		if ferr != nil {
			return nil, ferr
		}
	}
	r.Seconds = time.Since(start).Seconds()
	r.RecordsConsumed = int64(n)
	r.UniqueEventsPerSec = float64(r.UniqueEvents) / r.Seconds
	r.RecordsPerSec = float64(n) / r.Seconds
	r.BatchP50Ms, r.BatchP99Ms = percentileMs(durs, 0.5), percentileMs(durs, 0.99)
	r.PeakRSSMiB = peakRSSMiB()
	// Without processed_events rows, Check would only say so; the business
	// tables show the doubled effects.
	rep, err := orders.Check(ctx, e.pool, e.schema, stream.Unique, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	var business []string
	for _, p := range rep.Problems {
		if len(p) < 16 || p[:16] != "processed_events" {
			business = append(business, p)
		}
	}
	r.ExactlyOnce, r.Problems = len(business) == 0, nonNil(business)
	progress("naive-per-record: %.0f records/s; effects exactly once: %v (expected: no, duplicates double them)", r.RecordsPerSec, r.ExactlyOnce)
	return r, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
