package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/api"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

type serveOptions struct {
	embeddedKafka bool
	partitions    int
}

func newServeCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP API, the outbox relay and the processor together",
		Long: `serve runs, in one process, the seed's HTTP API on http.addr:

  POST /events-outbox/{bus}     an order, with an Idempotency-Key header (a UUID):
                                the order and its outbox row in one transaction
  GET  /audit/event/{id}        outbox row, processed rows per handler, emails, dead letters
  POST /demo/replay-event/{id}  publish the event again with the same id (a broker redelivery)
  GET  /healthz, /readyz, /metrics

the outbox relay (outbox rows to kafka.topics[0]) and the processor.
--embedded-kafka runs an in-process Kafka instead of kafka.brokers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := load(cmd)
			if err != nil {
				return err
			}
			s, err := a.startServe(cmd.Context(), o)
			if err != nil {
				return err
			}
			a.log.Info("serving", "addr", s.addr, "schema", a.cfg.Postgres.Schema)
			fmt.Fprintf(cmd.ErrOrStderr(), "onceflow serve: http://%s (POST /events-outbox/%s, GET /audit/event/{id}, POST /demo/replay-event/{id})\n",
				s.addr, a.cfg.Bus)
			return s.wait()
		},
	}
	cmd.Flags().BoolVar(&o.embeddedKafka, "embedded-kafka", false, "run an in-process Kafka (kfake) instead of connecting to kafka.brokers")
	cmd.Flags().IntVar(&o.partitions, "partitions", 3, "partitions of the topic, with --embedded-kafka")
	return cmd
}

// server is a running serve: the HTTP API, the relay and the processor.
type server struct {
	addr string
	wait func() error // returns when ctx has ended and everything stopped
}

// cleanup runs functions in reverse order of adding.
type cleanup []func()

func (c *cleanup) add(f func()) { *c = append(*c, f) }
func (c cleanup) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// startServe starts everything serve runs; wait stops it once ctx ended.
func (a *app) startServe(ctx context.Context, o serveOptions) (_ *server, err error) {
	var done cleanup
	defer func() {
		if err != nil {
			done.run()
		}
	}()
	shutdownTracing, err := a.startTracing(ctx)
	if err != nil {
		return nil, err
	}
	done.add(func() { flushTracing(ctx, shutdownTracing) })
	pool, err := a.openPool(ctx, a.cfg.Postgres.PoolSize+1)
	if err != nil {
		return nil, err
	}
	done.add(pool.Close)
	if err := a.migrate(ctx, pool, a.cfg.Postgres.Schema); err != nil {
		return nil, err
	}
	if err := a.checkSQLHandlers(ctx, pool); err != nil {
		return nil, err
	}
	brokers, err := a.serveBrokers(o, &done)
	if err != nil {
		return nil, err
	}
	if err := a.whenKafka(ctx, brokers); err != nil {
		return nil, err
	}
	if err := a.checkDeadLetterTopic(ctx, brokers); err != nil {
		return nil, err
	}
	m := metrics.New()
	m.AddPool("main", pool)
	consumer, err := a.serveConsumer(pool, brokers, m)
	if err != nil {
		return nil, err
	}
	relay, err := a.serveRelay(pool, brokers, &done)
	if err != nil {
		return nil, err
	}
	m.AddOutbox(relay.OldestPending)
	mux, err := a.seedMux(pool, relay, m, consumer)
	if err != nil {
		return nil, err
	}
	srv, err := api.Start(a.cfg.HTTP.Addr, mux)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Add(3)
	go func() { defer wg.Done(); errs[0] = consumer.Run(ctx) }()
	go func() { defer wg.Done(); errs[1] = relay.Run(ctx) }()
	go func() { defer wg.Done(); errs[2] = a.runRetention(ctx, pool, m) }()
	return &server{addr: srv.Addr(), wait: func() error {
		wg.Wait()
		herr := stopServer(ctx, srv)
		done.run()
		return errors.Join(errs[0], errs[1], errs[2], herr)
	}}, nil
}

// serveBrokers is kafka.brokers, or an embedded Kafka's with
// --embedded-kafka.
func (a *app) serveBrokers(o serveOptions, done *cleanup) ([]string, error) {
	if !o.embeddedKafka {
		return a.cfg.Kafka.Brokers, nil
	}
	// The embedded Kafka speaks plaintext: kafka.tls and kafka.sasl are for
	// kafka.brokers.
	a.kafkaSecurity = nil
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(int32(max(o.partitions, 1)), a.cfg.Kafka.Topics...)}
	if dlq := a.cfg.Kafka.DeadLetterTopic; dlq != "" {
		opts = append(opts, kfake.SeedTopics(1, dlq))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}
	done.add(c.Close)
	return c.ListenAddrs(), nil
}

// runRetention keeps the dedup state to dedup.retention until ctx ends
// (nothing when it is 0: kept forever).
func (a *app) runRetention(ctx context.Context, pool *pgxpool.Pool, m *metrics.Metrics) error {
	if a.cfg.Dedup.Retention <= 0 {
		return nil
	}
	schema, horizon := a.cfg.Postgres.Schema, a.cfg.Dedup.Retention
	return dedup.Retention{Pool: pool, Schema: schema, Horizon: horizon, Slices: a.cfg.Dedup.RetentionSlices, Logger: a.log,
		Hold: sink.HoldForReplays(pool, schema, horizon), OnStep: m.OnRetentionStep}.Run(ctx)
}

func (a *app) serveConsumer(pool *pgxpool.Pool, brokers []string, m *metrics.Metrics) (*processor.Consumer, error) {
	cache, err := dedup.New(a.cfg.Dedup.LRUSize)
	if err != nil {
		return nil, err
	}
	w, err := a.newWriter(pool, a.cfg.Postgres.Schema, cache, a.tp)
	if err != nil {
		return nil, err
	}
	cc := a.consumerConfig(brokers, a.cfg.Kafka.ClientID, a.tp, m)
	cc.KafkaOptions = append(cc.KafkaOptions, kgo.MetadataMinAge(time.Second))
	consumer, err := processor.New(cc, w)
	if err != nil {
		return nil, err
	}
	m.Add(consumer, cache)
	if a.cfg.Kafka.DeadLetterTopic != "" {
		m.AddDeadLetterTopic(w.OldestUnpublishedDeadLetter)
	}
	return consumer, nil
}

func (a *app) serveRelay(pool *pgxpool.Pool, brokers []string, done *cleanup) (*outbox.Relay, error) {
	id := a.cfg.Kafka.ClientID + "-relay"
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(id),
		kgo.ProducerLinger(2 * time.Millisecond)}, a.kafkaOptions(id)...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	done.add(cl.Close)
	return outbox.NewRelay(pool, cl, outbox.RelayConfig{Schema: a.cfg.Postgres.Schema, Logger: a.log, TracerProvider: a.tp})
}

// seedMux serves the seed's API, health and metrics.
func (a *app) seedMux(pool *pgxpool.Pool, relay *outbox.Relay, m *metrics.Metrics, c *processor.Consumer) (*http.ServeMux, error) {
	store, err := a.outboxStore(pool)
	if err != nil {
		return nil, err
	}
	seed, err := api.NewSeed(api.SeedConfig{Pool: pool, Store: store, Publisher: relay, Schema: a.cfg.Postgres.Schema,
		Bus: a.cfg.Bus, Topic: a.cfg.Kafka.Topics[0], Handlers: a.handlerNames(), Horizon: a.cfg.Dedup.Retention, TracerProvider: a.tp,
		Logger: a.log})
	if err != nil {
		return nil, err
	}
	kafka := api.Check{Name: "kafka", Ready: func(context.Context) error { return c.Ready() }}
	checks := []api.Check{api.PostgresCheck(pool), kafka}
	exportChecks(m, checks)
	mux := api.NewMux(m.Handler(), checks...)
	seed.Register(mux)
	return mux, nil
}

// outboxStore is the outbox of postgres.schema, whose events go to the
// first of kafka.topics; repeated keys are compared as orders.
func (a *app) outboxStore(pool *pgxpool.Pool) (*outbox.Store, error) {
	return outbox.NewStore(pool, outbox.StoreConfig{Schema: a.cfg.Postgres.Schema, Bus: a.cfg.Bus,
		Topic: a.cfg.Kafka.Topics[0], SamePayload: orders.Same})
}
