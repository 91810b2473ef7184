package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/api"
	"github.com/onceflow/onceflow/internal/demo"
	"github.com/onceflow/onceflow/metrics"
)

func newDemoCmd() *cobra.Command {
	var o demo.Options
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show effectively-once processing: an embedded Kafka, redeliveries, rebalances, a crash and a replay",
		Long: `demo starts an in-process Kafka (kfake), resets the Postgres schema
--demo-schema at postgres.dsn, and publishes the seed's order events
({"user_id":…,"items":[…]} with an event_id header), with --duplicates
redeliveries among them. Several group members consume while, every
--rebalance-every, one leaves (or crashes without committing) and another
joins; the stream is spread over four such periods, so that members leave
and one crashes while records still arrive. Once everything is published,
--replay of the events are published again. It prints progress, then a
summary read back from Postgres, and exits 1 unless every effect happened
exactly once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
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
			sum, err := a.demo(cmd.Context(), o, cmd.Flags().Changed("http-addr"), cmd.ErrOrStderr())
			switch {
			case errors.Is(err, demo.ErrInterrupted):
				return exitError(130)
			case err != nil:
				return err
			}
			if asJSON {
				if err := json.NewEncoder(cmd.OutOrStdout()).Encode(sum); err != nil {
					return err
				}
			} else {
				sum.Print(cmd.OutOrStdout())
			}
			if !sum.ExactlyOnce {
				return exitError(1)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.Events, "events", 20000, "unique order events to publish")
	fs.Float64Var(&o.Duplicates, "duplicates", 0.3, "redeliveries published among them, per event (0.3 = 30% more records)")
	fs.Float64Var(&o.Replay, "replay", 0.1, "fraction of the events published again after all were published (a replay)")
	fs.IntVar(&o.Partitions, "partitions", 6, "partitions of the demo topic")
	fs.IntVar(&o.Members, "members", 2, "consumer group members running at once")
	fs.DurationVar(&o.RebalanceEvery, "rebalance-every", time.Second, "how often a member leaves or crashes and another joins")
	fs.StringVar(&o.Schema, "demo-schema", "onceflow_demo", "Postgres schema the demo drops, recreates and writes to")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the generated events")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "give up if processing has not finished by then")
	fs.BoolVar(&asJSON, "json", false, "print the summary as one JSON object on stdout")
	return cmd
}

// demo wires the demo: tracing, Postgres, the handlers of the config for
// the demo's schema, metrics (served when serveMetrics), then demo.Run.
func (a *app) demo(ctx context.Context, o demo.Options, serveMetrics bool, progress io.Writer) (_ demo.Summary, err error) {
	// The demo's Kafka is embedded and speaks plaintext: kafka.tls and
	// kafka.sasl are for kafka.brokers.
	a.kafkaSecurity = nil
	shutdownTracing, err := a.startTracing(ctx)
	if err != nil {
		return demo.Summary{}, err
	}
	defer flushTracing(ctx, shutdownTracing)
	pool, err := a.openPool(ctx, max(a.cfg.Postgres.PoolSize, 2))
	if err != nil {
		return demo.Summary{}, err
	}
	defer pool.Close()
	hs, err := registry.build(o.Schema, a.cfg.Handlers)
	if err != nil {
		return demo.Summary{}, err
	}
	m := metrics.New()
	m.AddPool("main", pool)
	if serveMetrics {
		srv, err := api.Start(a.cfg.HTTP.Addr, api.NewMux(m.Handler(), postgresCheck(pool, a.cfg.Postgres.TxTimeout)))
		if err != nil {
			return demo.Summary{}, err
		}
		defer func() { err = errors.Join(err, stopServer(ctx, srv)) }()
		fmt.Fprintf(progress, "metrics on http://%s/metrics\n", srv.Addr())
	}
	writer := a.writerConfig(o.Schema, a.tp)
	writer.Handlers = hs
	return demo.Run(ctx, demo.Env{
		Pool: pool, Migrate: a.migrate,
		Consumer: a.consumerConfig(nil, "demo-member", a.tp, m), Writer: writer, LRUSize: a.cfg.Dedup.LRUSize,
		Handlers: a.cfg.Handlers, DeadLetterTopic: a.cfg.Kafka.DeadLetterTopic,
		ProducerOptions: a.kafkaTracing("demo-producer"), Started: m.Add, Progress: progress,
	}, o)
}
