package main

import (
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// pipelineConfig is the pipeline of `onceflow run`: the config's keys, the
// handlers built from the registry (and sql_handlers), and the tables of
// the configured Go handlers as its Migrate. dedup.lru_size
// 0 disables the cache, which is the pipeline's LRUSize -1.
func (a *app) pipelineConfig(pool *pgxpool.Pool, hs []sink.Handler, m *metrics.Metrics) pipeline.Config {
	k := a.cfg.Kafka
	lru := a.cfg.Dedup.LRUSize
	if lru == 0 {
		lru = -1
	}
	return pipeline.Config{
		Brokers: k.Brokers, Topics: k.Topics, Group: k.Group, DeadLetterTopic: k.DeadLetterTopic,
		Pool: pool, Schema: a.cfg.Postgres.Schema,
		Handlers: hs, Migrate: registry.migrator(a.cfg.Handlers), LRUSize: lru,
		Retention: a.cfg.Dedup.Retention, RetentionSlices: a.cfg.Dedup.RetentionSlices,
		Logger: a.log, TracerProvider: a.tp, Metrics: m,
		Consumer: a.consumerTuning(k.ClientID),
		Writer:   a.writerTuning(),
	}
}

// writerTuning is the sink config from the config, without what the
// caller sets: schema, group, handlers, cache, logger, tracing. Its Parse
// is the named Go handlers' shared one.
func (a *app) writerTuning() sink.Config {
	return sink.Config{Bus: a.cfg.Bus, TxTimeout: a.cfg.Postgres.TxTimeout, IdleTimeout: a.cfg.Postgres.IdleTimeout,
		Parse: registry.parser(a.cfg.Handlers)}
}

// writerConfig is the sink config for schema from the config, without
// handlers and cache.
func (a *app) writerConfig(schema string, tp trace.TracerProvider) sink.Config {
	c := a.writerTuning()
	c.Schema, c.Group, c.Logger, c.TracerProvider = schema, a.cfg.Kafka.Group, a.log, tp
	return c
}

// handlers are the handlers the config names, writing to schema, then
// those of sql_handlers.
func (a *app) handlers(schema string) ([]sink.Handler, error) {
	hs, err := registry.build(schema, a.cfg.Handlers)
	if err != nil {
		return nil, err
	}
	shs, err := a.sqlHandlers()
	if err != nil {
		return nil, err
	}
	for _, h := range shs {
		hs = append(hs, h)
	}
	return hs, nil
}

// newWriter builds the sink writer for schema from the config, with its
// handlers.
func (a *app) newWriter(pool *pgxpool.Pool, schema string, cache *dedup.Cache, tp trace.TracerProvider) (*sink.Writer, error) {
	hs, err := a.handlers(schema)
	if err != nil {
		return nil, err
	}
	cfg := a.writerConfig(schema, tp)
	cfg.Handlers, cfg.Cache = hs, cache
	return sink.New(pool, cfg)
}

// consumerTuning is the consumer config from the config, without what the
// caller sets: brokers, topics, group, dead-letter topic, logger, tracing,
// batch callback. name is its client id.
func (a *app) consumerTuning(name string) processor.Config {
	k := a.cfg.Kafka
	return processor.Config{
		ClientID:        name,
		BatchMaxRecords: a.cfg.Batch.MaxRecords, BatchMaxBytes: a.cfg.Batch.MaxBytes, BatchLinger: a.cfg.Batch.Linger,
		Decode:         a.decodeConfig(),
		CommitInterval: k.CommitInterval, SessionTimeout: k.SessionTimeout, RebalanceTimeout: k.RebalanceTimeout, HeartbeatInterval: k.HeartbeatInterval,
		DrainTimeout: a.cfg.DrainTimeout, RetryBackoff: a.cfg.Batch.RetryBackoff, MaxRetryBackoff: a.cfg.Batch.MaxRetryBackoff,
		CallTimeout: a.cfg.Postgres.CallTimeout, ProduceTimeout: k.ProduceTimeout,
		OffsetOutOfRange: processor.OutOfRange(k.OffsetOutOfRange),
		KafkaOptions:     slices.Clone(a.kafkaSecurity), // tracing is the pipeline's (kotel)

		GroupProtocol: processor.GroupProtocol(k.GroupProtocol), InstanceID: k.InstanceID,

		FetchMaxBytes: k.FetchMaxBytes, FetchMaxPartitionBytes: k.FetchMaxPartitionBytes,
	}
}

// consumerConfig builds a consumer's config; name is its client id.
func (a *app) consumerConfig(brokers []string, name string, tp trace.TracerProvider, m *metrics.Metrics) processor.Config {
	k := a.cfg.Kafka
	c := a.consumerTuning(name)
	c.Brokers, c.Topics, c.Group, c.DeadLetterTopic = brokers, k.Topics, k.Group, k.DeadLetterTopic
	c.Logger, c.TracerProvider, c.OnBatch = a.log, tp, m.OnBatch
	c.DedupHorizon = a.cfg.Dedup.Retention
	c.KafkaOptions = a.kafkaOptions(name)
	return c
}

// decodeConfig is how records are decoded (decode.*), for the consumer and
// for replay's dry run alike.
func (a *app) decodeConfig() processor.DecodeConfig {
	d := a.cfg.Decode
	return processor.DecodeConfig{Format: processor.Format(d.Format), IDSource: processor.IDSource(d.EventIDSource),
		IDHeader: d.EventIDHeader, IDField: d.EventIDField, MaxBytes: d.MaxRecordBytes, Registry: a.schemas}
}
