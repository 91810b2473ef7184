package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

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
			ctx := cmd.Context()
			a, err := load(cmd)
			if err != nil {
				return err
			}
			shutdownTracing, err := a.startTracing(ctx)
			if err != nil {
				return err
			}
			tp := a.tp
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_ = shutdownTracing(sctx)
			}()
			pool, err := a.openPool(ctx, a.cfg.Postgres.PoolSize)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := migrate(ctx, pool, a.cfg.Postgres.Schema); err != nil {
				return err
			}
			cache, err := dedup.New(a.cfg.Dedup.LRUSize)
			if err != nil {
				return err
			}
			w, err := a.newWriter(pool, a.cfg.Postgres.Schema, cache, tp)
			if err != nil {
				return err
			}
			m := metrics.New()
			c, err := processor.New(a.consumerConfig(a.cfg.Kafka.Brokers, a.cfg.Kafka.ClientID, tp, m), w)
			if err != nil {
				return err
			}
			m.Add(c, cache)
			if a.cfg.HTTP.Addr != "" {
				addr, _, err := serveHTTP(ctx, a.cfg.HTTP.Addr, baseMux(m, pool))
				if err != nil {
					return err
				}
				a.log.Info("http listening", "addr", addr)
			}
			done := make(chan struct{})
			defer close(done)
			abortOnSecondSignal(ctx, a, c, done)
			return c.Run(ctx)
		},
	}
}
