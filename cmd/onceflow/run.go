package main

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/api"
	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/processor"
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

// run is the service: it serves /healthz, /readyz and /metrics at once,
// waits for Postgres (then migrates) and for the brokers as long as it
// takes, saying what it waits for, and consumes until ctx ends. It returns
// early only on configuration errors.
func (a *app) run(ctx context.Context) (err error) {
	shutdownTracing, err := a.startTracing(ctx)
	if err != nil {
		return err
	}
	defer flushTracing(ctx, shutdownTracing)
	pool, err := a.newPool(a.cfg.Postgres.PoolSize)
	if err != nil {
		return err
	}
	defer pool.Close()
	m := metrics.New()
	var kafka consumerCheck
	if a.cfg.HTTP.Addr != "" {
		srv, err := api.Start(a.cfg.HTTP.Addr, api.NewMux(m.Handler(), api.PostgresCheck(pool), kafka.check()))
		if err != nil {
			return err
		}
		a.log.Info("http listening", "addr", srv.Addr())
		defer func() { err = errors.Join(err, stopServer(ctx, srv)) }()
	}
	if err := a.whenPostgres(ctx, "connect", pool.Ping); err != nil {
		return ignoreCanceled(ctx, err)
	}
	migrateAll := func(ctx context.Context) error { return migrate(ctx, pool, a.cfg.Postgres.Schema) }
	if err := a.whenPostgres(ctx, "migrate", migrateAll); err != nil {
		return ignoreCanceled(ctx, err)
	}
	checkSQL := func(ctx context.Context) error { return a.checkSQLHandlers(ctx, pool) }
	if err := a.whenPostgres(ctx, "check sql_handlers", checkSQL); err != nil {
		return ignoreCanceled(ctx, err)
	}
	cache, err := dedup.New(a.cfg.Dedup.LRUSize)
	if err != nil {
		return err
	}
	w, err := a.newWriter(pool, a.cfg.Postgres.Schema, cache, a.tp)
	if err != nil {
		return err
	}
	c, err := processor.New(a.consumerConfig(a.cfg.Kafka.Brokers, a.cfg.Kafka.ClientID, a.tp, m), w)
	if err != nil {
		return err
	}
	m.Add(c, cache)
	kafka.c.Store(c)
	stop := abortOnSecondSignal(ctx, a.log, c.Abort)
	defer stop()
	return c.Run(ctx)
}

// ignoreCanceled is nil when ctx ended (a signal while waiting), else err.
func ignoreCanceled(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
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
