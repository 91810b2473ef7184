package main

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
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
// -batch — with no Kafka, on as many connections as the scenarios have
// (see directRun.run).
func (b *bench) ceiling(ctx context.Context) (*Run, error) {
	d, err := b.direct(ctx, "ceiling", false)
	if err != nil {
		return nil, err
	}
	defer d.e.close()
	w, err := sink.New(d.e.pool, sink.Config{Schema: d.e.schema, Group: d.e.group, Handlers: d.hs, Parse: orders.ParseEvent, Logger: b.log})
	if err != nil {
		return nil, err
	}
	leases, err := w.Take(ctx, d.e.topic, d.partitions())
	if err != nil {
		return nil, err
	}
	progress("ceiling: %d records straight into sink.Writer, no Kafka", len(d.stream.Messages))
	var skipped atomic.Int64
	fences := make([]int64, len(d.parts))
	for p := range fences {
		fences[p] = -1
	}
	r, err := d.run(ctx, "ceiling", func(ctx context.Context, p int, batch []event) error {
		evs := make([]sink.Event, len(batch))
		for i, x := range batch {
			evs[i] = x.ev
		}
		res, err := w.Write(ctx, &sink.Batch{Topic: d.e.topic, Partition: int32(p), Epoch: leases[int32(p)].Epoch,
			Fence: fences[p], NextOffset: evs[len(evs)-1].Offset + 1, Events: evs})
		if err != nil {
			return err
		}
		fences[p] = evs[len(evs)-1].Offset + 1 // each partition is written by one goroutine
		skipped.Add(int64(res.SkippedPostgres))
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.SkippedPostgres = skipped.Load()
	progress("ceiling: %.0f events/s; exactly once: %v", r.UniqueEventsPerSec, r.ExactlyOnce)
	return r, nil
}

// directRun is a baseline that writes to Postgres with no Kafka: the
// stream split by partition the way the producer splits it, in an env of
// its own.
type directRun struct {
	b      *bench
	stream orders.Stream
	e      *env
	hs     []sink.Handler
	parts  [][]event
	// check, if set, replaces orders.Check on the env's schema (tables
	// shared with other runs are checked through views of their own rows).
	check func(ctx context.Context, unique map[uuid.UUID]orders.Order, handlers ...string) (orders.Report, error)
}

// event is one record of a direct run, its order parsed.
type event struct {
	ev    sink.Event
	order orders.Order
}

// direct generates the stream and the env of baseline name; with unique,
// only the first copy of each event is kept. The caller closes d.e.
func (b *bench) direct(ctx context.Context, name string, unique bool) (*directRun, error) {
	stream, err := orders.Generate(b.o.events, b.o.duplicates, b.o.seed)
	if err != nil {
		return nil, err
	}
	e, err := b.newEnv(ctx, name)
	if err != nil {
		return nil, err
	}
	d, err := b.directOn(e, stream, unique)
	if err != nil {
		e.close()
		return nil, err
	}
	return d, nil
}

// directOn is direct on an existing env and stream; the caller closes e.
func (b *bench) directOn(e *env, stream orders.Stream, unique bool) (*directRun, error) {
	hs, err := orders.Handlers(e.schema, b.o.handlers...)
	if err != nil {
		return nil, err
	}
	d := &directRun{b: b, stream: stream, e: e, hs: hs, parts: make([][]event, b.o.partitions)}
	seen := make(map[uuid.UUID]bool, len(stream.Unique))
	for _, m := range stream.Messages {
		if unique && seen[m.ID] {
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
		d.parts[p] = append(d.parts[p], event{sink.Event{ID: m.ID, Value: m.Value, Topic: e.topic, Partition: int32(p),
			Offset: int64(len(d.parts[p]))}, o})
	}
	return d, nil
}

func (d *directRun) partitions() []int32 {
	ps := make([]int32, len(d.parts))
	for p := range ps {
		ps[p] = int32(p)
	}
	return ps
}

// run writes every partition's events in batches of -batch with write,
// from -pool goroutines (the connections the scenarios' members share),
// each owning every -pool-th partition, then times and checks the result.
func (d *directRun) run(ctx context.Context, name string, write func(ctx context.Context, p int, batch []event) error) (*Run, error) {
	records := 0
	for _, evs := range d.parts {
		records += len(evs)
	}
	r := &Run{Name: name, Kind: "baseline", Records: records, UniqueEvents: len(d.stream.Unique)}
	var mu sync.Mutex
	var durs []time.Duration
	// With -spans a baseline reports its CPU split and WAL too, for the
	// scenarios' to be read against.
	prof, err := d.b.startProfile(ctx, d.e, false)
	if err != nil {
		return nil, err
	}
	resetPeakRSS()
	start := time.Now()
	var wg sync.WaitGroup
	conns := min(d.b.o.poolSize, len(d.parts))
	errs := make(chan error, conns)
	for worker := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := worker; p < len(d.parts); p += conns {
				for i := 0; i < len(d.parts[p]); i += d.b.o.batch {
					t := time.Now()
					if err := write(ctx, p, d.parts[p][i:min(i+d.b.o.batch, len(d.parts[p]))]); err != nil {
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
	if err := prof.done(ctx, r); err != nil {
		return nil, err
	}
	r.UniqueEventsPerSec = float64(r.UniqueEvents) / r.Seconds
	r.RecordsPerSec = float64(r.Records) / r.Seconds
	r.RecordsConsumed = int64(r.Records)
	r.BatchP50Ms, r.BatchP99Ms = percentileMs(durs, 0.5), percentileMs(durs, 0.99)
	r.PeakRSSMiB = peakRSSMiB()
	check := d.check
	if check == nil {
		check = func(ctx context.Context, unique map[uuid.UUID]orders.Order, handlers ...string) (orders.Report, error) {
			return orders.Check(ctx, d.e.pool, d.e.schema, unique, handlers...)
		}
	}
	rep, err := check(ctx, d.stream.Unique, d.b.o.handlers...)
	if err != nil {
		return nil, err
	}
	r.ExactlyOnce, r.Problems = rep.ExactlyOnce(), nonNil(rep.Problems)
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
