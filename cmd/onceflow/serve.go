package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/api"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pipeline"
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
--embedded-kafka runs an in-process Kafka instead of kafka.brokers.

Like run, serve answers /healthz, /readyz and /metrics at once and waits
for Postgres and the brokers as long as it takes: /readyz answers 503
naming what it waits for, onceflow_ready is 0, and the seed's endpoints
answer 503 until Postgres answered and the tables exist. It ends early
only on what waiting cannot cure (the configuration, a refused login, a
missing dead-letter topic), naming it.`,
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
	addr     string
	migrated <-chan struct{} // closed once Postgres answered and the tables exist
	wait     func() error    // returns when ctx has ended and everything stopped
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
// Like run, it serves /healthz, /readyz and /metrics at once and then
// waits for Postgres (and migrates) and for the brokers as long as it
// takes, /readyz naming what it waits for; the seed's endpoints answer
// 503 until the tables exist, and the relay starts once they do.
// startServe returns an error only for what waiting cannot cure (the
// HTTP address, the config); wait returns those found later (a refused
// login, sql_handlers Postgres refuses, an address where something other
// than Kafka answers, a missing dead-letter topic).
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
	pool, err := a.newPool(a.cfg.Postgres.PoolSize + 1) // connects lazily
	if err != nil {
		return nil, err
	}
	done.add(pool.Close)
	brokers, err := a.serveBrokers(o, &done)
	if err != nil {
		return nil, err
	}
	hs, err := a.handlers(a.cfg.Postgres.Schema)
	if err != nil {
		return nil, err
	}
	m := metrics.New()
	cfg := a.pipelineConfig(pool, hs, m)
	cfg.Brokers = brokers
	cfg.Consumer.KafkaOptions = append(cfg.Consumer.KafkaOptions, kgo.MetadataMinAge(time.Second))
	handlersMigrate := cfg.Migrate
	cfg.Migrate = func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := outbox.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		if err := orders.MigrateProducer(ctx, pool, schema); err != nil {
			return err
		}
		return handlersMigrate(ctx, pool, schema)
	}
	relay, err := a.serveRelay(pool, brokers, &done)
	if err != nil {
		return nil, err
	}
	// migrated is closed once Postgres answered and the tables exist:
	// the relay and the seed's endpoints start then.
	migrated := make(chan struct{})
	var waitingKafka atomic.Bool
	cfg.BeforeConsume = func(ctx context.Context) error {
		close(migrated)
		if err := a.checkSQLHandlers(ctx, pool); err != nil {
			return err
		}
		if err := a.checkSchemaRegistry(ctx); err != nil {
			return err
		}
		waitingKafka.Store(true)
		defer waitingKafka.Store(false)
		if err := a.whenKafka(ctx, brokers); err != nil {
			return err
		}
		return a.checkDeadLetterTopic(ctx, brokers)
	}
	p, err := pipeline.New(cfg)
	if err != nil {
		return nil, err
	}
	m.AddOutbox(relay.OldestPending)
	kafka := api.Check{Name: "kafka", Ready: func(context.Context) error {
		if waitingKafka.Load() {
			return errors.New("the consumer has not started: waiting for the kafka brokers")
		}
		return p.Ready()
	}}
	mux, err := a.seedMux(pool, relay, m, kafka)
	if err != nil {
		return nil, err
	}
	srv, err := api.Start(a.cfg.HTTP.Addr, untilMigrated(mux, migrated))
	if err != nil {
		return nil, err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var perr, rerr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer stopRelay() // a pipeline that gave up ends serve
		perr = schemaRegistryRefused(p.Run(ctx))
	}()
	go func() {
		defer wg.Done()
		select {
		case <-migrated:
			rerr = relay.Run(rctx)
		case <-rctx.Done():
		}
	}()
	return &server{addr: srv.Addr(), migrated: migrated, wait: func() error {
		wg.Wait()
		herr := stopServer(ctx, srv)
		done.run()
		return errors.Join(perr, rerr, herr)
	}}, nil
}

// untilMigrated serves h's health and metrics at once, and its other
// routes once migrated is closed; before, they answer 503.
func untilMigrated(h http.Handler, migrated <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-migrated:
		default:
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
			default:
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "5")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":"starting: waiting for postgres (see /readyz)"}` + "\n"))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
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

func (a *app) serveRelay(pool *pgxpool.Pool, brokers []string, done *cleanup) (*outbox.Relay, error) {
	id := a.cfg.Kafka.ClientID + "-relay"
	// The topic is created on first use, as onceflow produce does, where
	// the brokers create topics on request (with their default partitions).
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(id),
		kgo.ProducerLinger(2 * time.Millisecond), kgo.AllowAutoTopicCreation()}, a.kafkaOptions(id)...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	done.add(cl.Close)
	return outbox.NewRelay(pool, cl, outbox.RelayConfig{Schema: a.cfg.Postgres.Schema, Logger: a.log, TracerProvider: a.tp})
}

// seedMux serves the seed's API, health and metrics.
func (a *app) seedMux(pool *pgxpool.Pool, relay *outbox.Relay, m *metrics.Metrics, kafka api.Check) (*http.ServeMux, error) {
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
	checks := []api.Check{postgresCheck(pool, a.cfg.Postgres.TxTimeout), kafka}
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
