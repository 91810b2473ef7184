package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/config"
	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/wire"
)

type demoOptions struct {
	events         int
	duplicates     float64
	replay         float64
	partitions     int
	members        int
	rebalanceEvery time.Duration
	schema         string
	seed           uint64
	timeout        time.Duration
	json           bool
}

func (o demoOptions) validate() error {
	var ps []error
	if o.events < 1 {
		ps = append(ps, fmt.Errorf("--events %d: must be at least 1", o.events))
	}
	if o.duplicates < 0 || o.duplicates > 10 {
		ps = append(ps, fmt.Errorf("--duplicates %v: must be 0..10", o.duplicates))
	}
	if o.replay < 0 || o.replay > 1 {
		ps = append(ps, fmt.Errorf("--replay %v: must be 0..1", o.replay))
	}
	if o.partitions < 1 || o.partitions > 1000 {
		ps = append(ps, fmt.Errorf("--partitions %d: must be 1..1000", o.partitions))
	}
	if o.members < 1 || o.members > 100 {
		ps = append(ps, fmt.Errorf("--members %d: must be 1..100", o.members))
	}
	if o.rebalanceEvery < 100*time.Millisecond {
		ps = append(ps, fmt.Errorf("--rebalance-every %v: must be at least 100ms", o.rebalanceEvery))
	}
	if !config.IsIdentifier(o.schema) || o.schema == "public" {
		ps = append(ps, fmt.Errorf("--demo-schema %q: must be a lower-case identifier other than public (the demo drops it)", o.schema))
	}
	return errors.Join(ps...)
}

func newDemoCmd() *cobra.Command {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show effectively-once processing: an embedded Kafka, redeliveries, rebalances, a crash and a replay",
		Long: `demo starts an in-process Kafka (kfake), resets the Postgres schema
--demo-schema at postgres.dsn, and publishes the seed's order events
({"user_id":…,"items":[…]} with an event_id header), with --duplicates
redeliveries among them. Several group members consume while, every
--rebalance-every, one leaves (or crashes without committing) and another
joins; once everything is published, --replay of the events are published
again. It prints progress, then a summary read back from Postgres, and
exits 1 unless every effect happened exactly once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			a, err := load(cmd)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("log-level") {
				quiet := a.cfg.Log
				quiet.Level = "warn" // dedup.skip lines (info) would drown the progress
				a.log = newLogger(quiet)
			}
			return runDemo(cmd.Context(), a, o, cmd.Flags().Changed("http-addr"), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.events, "events", 20000, "unique order events to publish")
	fs.Float64Var(&o.duplicates, "duplicates", 0.3, "redeliveries published among them, per event (0.3 = 30% more records)")
	fs.Float64Var(&o.replay, "replay", 0.1, "fraction of the events published again after all were published (a replay)")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of the demo topic")
	fs.IntVar(&o.members, "members", 2, "consumer group members running at once")
	fs.DurationVar(&o.rebalanceEvery, "rebalance-every", time.Second, "how often a member leaves or crashes and another joins")
	fs.StringVar(&o.schema, "demo-schema", "onceflow_demo", "Postgres schema the demo drops, recreates and writes to")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the generated events")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up if processing has not finished by then")
	fs.BoolVar(&o.json, "json", false, "print the summary as one JSON object on stdout")
	return cmd
}

// demoSummary is the demo's result. Counts marked (pairs) are
// (event, handler) pairs; the rest are read back from Postgres.
type demoSummary struct {
	RecordsPublished    int              `json:"records_published"`
	UniqueEvents        int              `json:"unique_events"`
	DuplicatesPublished int              `json:"duplicates_published"`
	ReplayedEvents      int              `json:"replayed_events"`
	RecordsConsumed     int64            `json:"records_consumed"`
	SkippedLRU          int64            `json:"duplicates_skipped_lru"`
	SkippedPostgres     int64            `json:"duplicates_skipped_postgres"`
	DeadLetters         int64            `json:"dead_letters"`
	ProcessedRows       map[string]int64 `json:"processed_events_rows"`
	ProcessedTotal      int64            `json:"processed_events_total"`
	EmailsSent          int64            `json:"emails_sent"`
	OrdersCounter       int64            `json:"analytics_orders"`
	ItemsCounter        int64            `json:"analytics_items"`
	ItemsReserved       int64            `json:"inventory_reserved"`
	RecommenderWeight   int64            `json:"recommender_weight"`
	MembersStarted      int              `json:"members_started"`
	MembersLeft         int              `json:"members_left"`
	MembersCrashed      int              `json:"members_crashed"`
	PartitionsAssigned  int64            `json:"partitions_assigned"`
	Schema              string           `json:"schema"`
	ElapsedSeconds      float64          `json:"elapsed_seconds"`
	ExactlyOnce         bool             `json:"exactly_once"`
	Problems            []string         `json:"problems"`
}

type demoMember struct {
	name   string
	c      *processor.Consumer
	cancel context.CancelFunc
	done   chan error
}

func runDemo(ctx context.Context, a *app, o demoOptions, serveMetrics bool, stdout, stderr io.Writer) error {
	start := time.Now()
	progress := func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }

	shutdownTracing, err := a.startTracing(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = shutdownTracing(context.WithoutCancel(ctx)) }()
	tp := a.tp
	pool, err := a.openPool(ctx, max(a.cfg.Postgres.PoolSize, 2))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{o.schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("reset schema %s: %w", o.schema, err)
	}
	if err := migrate(ctx, pool, o.schema); err != nil {
		return err
	}

	topic := a.cfg.Kafka.Topics[0]
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), topic),
		kfake.SeedTopics(1, a.cfg.Kafka.DeadLetterTopic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("embedded kafka: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	stream, err := orders.Generate(o.events, o.duplicates, o.seed)
	if err != nil {
		return err
	}
	replay := stream.Messages[:0:0]
	for _, m := range stream.Messages {
		if len(replay) >= int(float64(o.events)*o.replay) {
			break
		}
		if len(replay) == 0 || replay[len(replay)-1].ID != m.ID {
			replay = append(replay, m)
		}
	}
	total := int64(len(stream.Messages) + len(replay))
	progress("onceflow demo: embedded Kafka at %s, topic %s with %d partitions; Postgres schema %s",
		brokers[0], topic, o.partitions, o.schema)
	progress("publishing %d records: %d unique order events, %d redeliveries among them, then a replay of %d",
		total, o.events, len(stream.Messages)-o.events, len(replay))

	m := metrics.New()
	var pubErr error
	published := make(chan struct{})
	var sent atomic.Int64
	go func() {
		defer close(published)
		pubErr = publish(ctx, brokers, topic, stream.Messages, replay, &sent, a.kafkaTracing("demo-producer")...)
	}()

	var (
		mu      sync.Mutex
		all     []*demoMember
		running []*demoMember
		sum     demoSummary
	)
	startMember := func() error {
		mu.Lock()
		defer mu.Unlock()
		cache, err := dedup.New(a.cfg.Dedup.LRUSize)
		if err != nil {
			return err
		}
		w, err := a.newWriter(pool, o.schema, cache, tp)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("member-%d", len(all)+1)
		cfg := a.consumerConfig(brokers, name, tp, m)
		cfg.SessionTimeout, cfg.RebalanceTimeout = 3*time.Second, 10*time.Second
		cfg.KafkaOptions = append(cfg.KafkaOptions, kgo.MetadataMinAge(100*time.Millisecond), kgo.HeartbeatInterval(300*time.Millisecond))
		c, err := processor.New(cfg, w)
		if err != nil {
			return err
		}
		m.Add(c, cache)
		mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		dm := &demoMember{name: name, c: c, cancel: cancel, done: make(chan error, 1)}
		go func() { dm.done <- c.Run(mctx) }()
		all = append(all, dm)
		running = append(running, dm)
		sum.MembersStarted++
		return nil
	}
	// stopOldest stops the longest-running member: cleanly, or as a crash.
	stopOldest := func(crash bool) {
		mu.Lock()
		if len(running) == 0 {
			mu.Unlock()
			return
		}
		dm := running[0]
		running = running[1:]
		if crash {
			sum.MembersCrashed++
		} else {
			sum.MembersLeft++
		}
		mu.Unlock()
		if crash {
			dm.c.Abort()
		} else {
			dm.cancel()
		}
		<-dm.done
		dm.cancel()
	}

	if serveMetrics {
		addr, _, err := serveHTTP(ctx, a.cfg.HTTP.Addr, baseMux(m, pool))
		if err != nil {
			return err
		}
		progress("metrics on http://%s/metrics", addr)
	}
	for range o.members {
		if err := startMember(); err != nil {
			return err
		}
	}

	deadline := time.After(o.timeout)
	churn := time.NewTicker(o.rebalanceEvery)
	defer churn.Stop()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	cycles := 0
	var finished bool
	for !finished {
		select {
		case <-ctx.Done():
			progress("interrupted")
			stopAll(&mu, &running)
			return exitError(130)
		case <-deadline:
			stopAll(&mu, &running)
			return fmt.Errorf("demo did not finish within --timeout %v", o.timeout)
		case <-churn.C:
			cycles++
			crash := cycles%3 == 0 // every third change is a crash: no Kafka commit at all
			if err := startMember(); err != nil {
				return err
			}
			stopOldest(crash)
		case <-tick.C:
			done, err := storedTotal(ctx, pool, o.schema, a.cfg.Kafka.Group)
			if err != nil {
				return err
			}
			var s processor.Stats
			for _, dm := range snapshot(&mu, &all) {
				s = s.Plus(dm.c.Stats())
			}
			mu.Lock()
			members, crashed, left := len(running), sum.MembersCrashed, sum.MembersLeft
			mu.Unlock()
			progress("[%5.1fs] published %d/%d · committed %d · consumed %d · skipped lru %d, postgres %d · members %d (left %d, crashed %d)",
				time.Since(start).Seconds(), sent.Load(), total, done, s.RecordsConsumed, s.SkippedLRU, s.SkippedPostgres,
				members, left, crashed)
			select {
			case <-published:
				if pubErr != nil {
					stopAll(&mu, &running)
					return fmt.Errorf("publish: %w", pubErr)
				}
				finished = done >= total
			default:
			}
		}
	}
	stopAll(&mu, &running)

	var s processor.Stats
	for _, dm := range all {
		s = s.Plus(dm.c.Stats())
	}
	rep, err := orders.Check(ctx, pool, o.schema, stream.Unique, a.cfg.Handlers...)
	if err != nil {
		return err
	}
	var dead int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{o.schema, "dead_letters"}.Sanitize()).Scan(&dead); err != nil {
		return err
	}
	sum.RecordsPublished = int(total)
	sum.UniqueEvents = o.events
	sum.DuplicatesPublished = len(stream.Messages) - o.events
	sum.ReplayedEvents = len(replay)
	sum.RecordsConsumed = s.RecordsConsumed
	sum.SkippedLRU, sum.SkippedPostgres = s.SkippedLRU, s.SkippedPostgres
	sum.DeadLetters = dead
	sum.ProcessedRows = rep.ProcessedRows
	for _, n := range rep.ProcessedRows {
		sum.ProcessedTotal += n
	}
	sum.EmailsSent, sum.OrdersCounter, sum.ItemsCounter = rep.EmailsSent, rep.OrdersCounter, rep.ItemsCounter
	sum.ItemsReserved, sum.RecommenderWeight = rep.ItemsReserved, rep.RecommenderWeight
	sum.PartitionsAssigned = s.Assigned
	sum.Schema = o.schema
	sum.ElapsedSeconds = time.Since(start).Seconds()
	sum.ExactlyOnce = rep.ExactlyOnce()
	sum.Problems = rep.Problems
	if sum.Problems == nil {
		sum.Problems = []string{}
	}

	if o.json {
		if err := json.NewEncoder(stdout).Encode(sum); err != nil {
			return err
		}
	} else {
		printSummary(stdout, sum, len(a.cfg.Handlers))
	}
	if !sum.ExactlyOnce {
		return exitError(1)
	}
	return nil
}

func printSummary(w io.Writer, s demoSummary, handlers int) {
	yes := "yes: every event's effects happened exactly once"
	if !s.ExactlyOnce {
		yes = "NO"
	}
	fmt.Fprintf(w, `
onceflow demo summary (read back from Postgres schema %s)
  records published       %d  (%d unique events, %d redeliveries, %d replayed)
  records consumed        %d  (some read again after rebalances)
  duplicates skipped      %d by the LRU, %d by Postgres  ((event, handler) pairs)
  dead letters            %d
  members                 %d started, %d left, %d crashed without committing; %d partition assignments
  processed_events rows   %d  (%d handlers x %d events)
  emails_sent             %d
  analytics counters      orders %d, items %d
  inventory reserved      %d items
  recommender weight      %d
  exactly once            %s
`, s.Schema, s.RecordsPublished, s.UniqueEvents, s.DuplicatesPublished, s.ReplayedEvents,
		s.RecordsConsumed, s.SkippedLRU, s.SkippedPostgres, s.DeadLetters,
		s.MembersStarted, s.MembersLeft, s.MembersCrashed, s.PartitionsAssigned,
		s.ProcessedTotal, handlers, s.UniqueEvents, s.EmailsSent, s.OrdersCounter, s.ItemsCounter,
		s.ItemsReserved, s.RecommenderWeight, yes)
	for _, p := range s.Problems {
		fmt.Fprintf(w, "  problem: %s\n", p)
	}
}

// publish produces msgs in ten slices, then the replay.
func publish(ctx context.Context, brokers []string, topic string, msgs, replay []orders.Message, sent *atomic.Int64, opts ...kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5 * time.Millisecond)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	send := func(ms []orders.Message) error {
		recs := make([]*kgo.Record, len(ms))
		for i, m := range ms {
			recs[i] = wire.NewRecord(topic, m.ID, m.Value)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return err
		}
		sent.Add(int64(len(ms)))
		return nil
	}
	step := max(1, len(msgs)/10)
	for i := 0; i < len(msgs); i += step {
		if err := send(msgs[i:min(i+step, len(msgs))]); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(150 * time.Millisecond):
		}
	}
	return send(replay)
}

// storedTotal sums the next offsets stored for group: with offsets from 0,
// the number of records whose batch committed.
func storedTotal(ctx context.Context, pool *pgxpool.Pool, schema, group string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+
		pgx.Identifier{schema, "sink_offsets"}.Sanitize()+` WHERE consumer_group = $1`, group).Scan(&n)
	return n, err
}

func stopAll(mu *sync.Mutex, running *[]*demoMember) {
	mu.Lock()
	rs := *running
	*running = nil
	mu.Unlock()
	for _, dm := range rs {
		dm.cancel()
	}
	for _, dm := range rs {
		<-dm.done
	}
}

func snapshot(mu *sync.Mutex, all *[]*demoMember) []*demoMember {
	mu.Lock()
	defer mu.Unlock()
	return append([]*demoMember(nil), *all...)
}
