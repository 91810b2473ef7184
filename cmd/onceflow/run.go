package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/api"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/pipeline"
)

func newRunCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Run the processor: consume kafka.topics and apply the handlers, until SIGTERM",
		Long: `run joins kafka.group, consumes kafka.topics with one worker per assigned
partition, and applies the configured handlers in one Postgres transaction
per batch. It serves /metrics, /healthz and /readyz on http.addr.

SIGTERM or SIGINT drains: in-flight batches finish, offsets are committed,
the member leaves the group. A second signal aborts at once without
committing; Postgres keeps what committed, and the next owner resumes there.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := load(cmd)
			if err != nil {
				return err
			}
			return a.run(cmd.Context())
		},
	}
}

// run is the service: package pipeline with the config's handlers, plus
// what only the command has — tracing set up from the environment, the
// HTTP server (/healthz, /readyz, /metrics) served at once, and the
// second signal that aborts. The pipeline waits for Postgres (then
// migrates) and for the brokers as long as it takes, and /readyz names
// what it waits for; run returns early only on configuration errors.
// A second signal's abort returns an exitError (128 + the signal).
func (a *app) run(ctx context.Context) (err error) {
	shutdownTracing, err := a.startTracing(ctx)
	if err != nil {
		return err
	}
	defer flushTracing(ctx, shutdownTracing)
	if a.schemas != nil {
		defer a.schemas.Close()
	}
	pool, err := a.newPool(a.cfg.Postgres.PoolSize)
	if err != nil {
		return err
	}
	defer pool.Close()
	hs, err := a.handlers(a.cfg.Postgres.Schema)
	if err != nil {
		return err
	}
	m := metrics.New()
	cfg := a.pipelineConfig(pool, hs, m)
	// Once Postgres is ready and migrated: sql_handlers checked against
	// the tables, then the brokers, then the dead-letter topic — a
	// statement Postgres refuses, an address where something other than
	// Kafka answers, a refused SASL login, an untrusted certificate or a
	// dead-letter topic the brokers do not have ends run at once, naming
	// the handler or the keys to check.
	var waitingKafka atomic.Bool
	cfg.BeforeConsume = func(ctx context.Context) error {
		if err := a.checkSQLHandlers(ctx, pool); err != nil {
			return err
		}
		if err := a.checkSchemaRegistry(ctx); err != nil {
			return err
		}
		waitingKafka.Store(true)
		defer waitingKafka.Store(false)
		if err := a.whenKafka(ctx, a.cfg.Kafka.Brokers); err != nil {
			return err
		}
		return a.checkDeadLetterTopic(ctx, a.cfg.Kafka.Brokers)
	}
	p, err := pipeline.New(cfg)
	if err != nil {
		return err
	}
	if a.cfg.HTTP.Addr != "" {
		kafka := api.Check{Name: "kafka", Ready: func(context.Context) error {
			if waitingKafka.Load() {
				return errors.New("the consumer has not started: waiting for the kafka brokers")
			}
			return p.Ready()
		}}
		checks := []api.Check{postgresCheck(pool, a.cfg.Postgres.TxTimeout), kafka}
		exportChecks(m, checks)
		srv, err := api.Start(a.cfg.HTTP.Addr, api.NewMux(m.Handler(), checks...))
		if err != nil {
			return err
		}
		a.log.Info("http listening", "addr", srv.Addr())
		defer func() { err = errors.Join(err, stopServer(ctx, srv)) }()
	}
	stop := abortOnSecondSignal(ctx, a.log, p.Abort)
	err = schemaRegistryRefused(p.Run(ctx))
	return errors.Join(err, stop())
}

// stopServer stops srv within 5s, also when ctx has ended.
func stopServer(ctx context.Context, srv *api.Server) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return srv.Stop(sctx)
}

// flushTracing flushes pending spans within 5s, also when ctx has ended.
func flushTracing(ctx context.Context, shutdown func(context.Context) error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = shutdown(sctx)
}

// exportChecks exports each of /readyz's checks as onceflow_ready{check}.
func exportChecks(m *metrics.Metrics, checks []api.Check) {
	for _, c := range checks {
		m.AddCheck(c.Name, c.Ready)
	}
}
