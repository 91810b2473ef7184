package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
)

// env is an experiment's topic, group and schema.
type env struct {
	brokers []string
	topic   string
	group   string
	schema  string
	pool    *pgxpool.Pool
	close   func()
}

// newEnv makes a topic and its dead-letter topic (topic.dlq: a member
// refuses to start without the dead-letter topic it is given) on
// o.brokers, or an embedded kfake cluster, and a schema with onceflow's
// and the demo's tables, all named after name and a random suffix;
// e.close drops them.
func newEnv(ctx context.Context, o options, name string) (*env, error) {
	var r [3]byte
	_, _ = rand.Read(r[:])
	suffix := strings.ReplaceAll(name, "-", "_") + "_" + hex.EncodeToString(r[:])
	e := &env{topic: "bench-" + suffix, group: "bench-" + suffix, schema: "bench_" + suffix}
	var closers []func()
	e.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	pc, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(o.poolSize)
	pc.ConnConfig.RuntimeParams["application_name"] = "onceflow-" + e.schema
	if e.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, err
	}
	closers = append(closers, func() {
		_, _ = e.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{e.schema}.Sanitize()+` CASCADE`)
		e.pool.Close()
	})
	if err := sink.Migrate(ctx, e.pool, e.schema); err != nil {
		e.close()
		return nil, err
	}
	if err := orders.Migrate(ctx, e.pool, e.schema); err != nil {
		e.close()
		return nil, err
	}
	if o.brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), e.topic, e.topic+".dlq"))
		if err != nil {
			e.close()
			return nil, err
		}
		closers = append(closers, c.Close)
		e.brokers = c.ListenAddrs()
		return e, nil
	}
	e.brokers = strings.Split(o.brokers, ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		e.close()
		return nil, err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, int32(o.partitions), 1, nil, e.topic, e.topic+".dlq")
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		e.close()
		return nil, fmt.Errorf("create topic: %w", err)
	}
	closers = append(closers, func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
		if err == nil {
			_, _ = kadm.NewClient(cl).DeleteTopics(context.Background(), e.topic, e.topic+".dlq")
			cl.Close()
		}
	})
	return e, nil
}

// RawCopy is a backlog run's raw copy on the tables the member left.
type RawCopy struct {
	UniqueEvents       int      `json:"unique_events"`
	Seconds            float64  `json:"seconds"`
	UniqueEventsPerSec float64  `json:"unique_events_per_sec"`
	ExactlyOnce        bool     `json:"exactly_once"` // its rows as expected
	Problems           []string `json:"problems"`
}

// rawCopyOn writes fresh unique events (another seed than the backlog's,
// the same kind of ids) on e's tables as the member left them (the
// pre-fill and the run's rows), by the cheapest path: per transaction of
// o.batch events of one partition, their processed_events rows (bus
// raw-copy) into the current dedup slice and their emails_sent rows by
// binary COPY, the other handlers' effects by their set-based upserts, on
// o.poolSize connections. Its check counts its own processed_events and
// emails_sent rows; the counters are shared with the run and not checked.
// This is the backlog's reference on large tables; the raw-copy baseline
// of the scenario benchmark is onceflow bench's.
func rawCopyOn(ctx context.Context, e *env, o backlogOptions, backlogEvents int) (*RawCopy, error) {
	n := o.rawEvents
	if n == 0 {
		n = backlogEvents
	}
	stream, err := orders.Generate(n, 0, o.seed+1)
	if err != nil {
		return nil, err
	}
	if o.ids == "v7" {
		if stream, err = timeOrdered(stream); err != nil {
			return nil, err
		}
	}
	var maxEmailID int64
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+pgx.Identifier{e.schema, "emails_sent"}.Sanitize()).Scan(&maxEmailID); err != nil {
		return nil, err
	}
	hs, err := orders.Handlers(e.schema, o.handlers...)
	if err != nil {
		return nil, err
	}
	var slice int32
	if err := e.pool.QueryRow(ctx, `SELECT max(slice) FROM `+pgx.Identifier{e.schema, "processed_events_slices"}.Sanitize()).Scan(&slice); err != nil {
		return nil, fmt.Errorf("the current dedup slice: %w", err)
	}
	processed := pgx.Identifier{e.schema, fmt.Sprintf("processed_events_s%d", slice)}
	emails := pgx.Identifier{e.schema, "emails_sent"}
	type event struct {
		ev    sink.Event
		order orders.Order
	}
	parts := make([][]event, o.partitions)
	for _, m := range stream.Messages {
		ord, err := orders.Parse(m.Value)
		if err != nil {
			return nil, err
		}
		h := fnv.New32a()
		_, _ = h.Write(m.ID[:])
		p := int(h.Sum32() % uint32(o.partitions))
		parts[p] = append(parts[p], event{sink.Event{ID: m.ID, Value: m.Value, Topic: e.topic, Partition: int32(p), Offset: int64(len(parts[p]))}, ord})
	}
	write := func(ctx context.Context, batch []event) error {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows := make([][]any, 0, len(batch)*len(hs))
		for _, x := range batch {
			for _, h := range hs {
				rows = append(rows, []any{x.ev.ID, h.Name(), rawCopyBus, slice})
			}
		}
		if _, err := tx.CopyFrom(ctx, processed, []string{"event_id", "handler", "bus", "slice"}, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("copy processed_events: %w", err)
		}
		evs := make([]sink.Event, len(batch))
		for i, x := range batch {
			evs[i] = x.ev
		}
		for _, h := range hs {
			if h.Name() != orders.Email {
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
	progress("raw-copy: %d unique events by COPY into the same tables", n)
	start := time.Now()
	var wg sync.WaitGroup
	conns := min(o.poolSize, len(parts))
	errs := make(chan error, conns) // one per worker at most
	for worker := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := worker; p < len(parts); p += conns {
				for i := 0; i < len(parts[p]); i += o.batch {
					if err := write(ctx, parts[p][i:min(i+o.batch, len(parts[p]))]); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	r := &RawCopy{UniqueEvents: len(stream.Unique), Seconds: time.Since(start).Seconds()}
	r.UniqueEventsPerSec = float64(r.UniqueEvents) / r.Seconds
	cr, err := rawCopyCheck(ctx, e.pool, e.schema, maxEmailID, len(stream.Unique), o.handlers)
	if err != nil {
		return nil, err
	}
	r.ExactlyOnce, r.Problems = cr.ExactlyOnce(), nonNil(cr.Problems)
	progress("raw-copy: %.0f events/s; rows as expected: %v", r.UniqueEventsPerSec, r.ExactlyOnce)
	return r, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
