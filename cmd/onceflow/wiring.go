package main

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// writerConfig is the sink config for schema from the config, without
// handlers and cache.
func (a *app) writerConfig(schema string, tp trace.TracerProvider) sink.Config {
	return sink.Config{Schema: schema, Group: a.cfg.Kafka.Group, Bus: a.cfg.Bus,
		TxTimeout: a.cfg.Postgres.TxTimeout, Logger: a.log, TracerProvider: tp}
}

// newWriter builds the sink writer for schema from the config, with the
// handlers the config names, then those of sql_handlers.
func (a *app) newWriter(pool *pgxpool.Pool, schema string, cache *dedup.Cache, tp trace.TracerProvider) (*sink.Writer, error) {
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
	cfg := a.writerConfig(schema, tp)
	cfg.Handlers, cfg.Cache = hs, cache
	return sink.New(pool, cfg)
}

// consumerConfig builds a consumer's config; name is its client id.
func (a *app) consumerConfig(brokers []string, name string, tp trace.TracerProvider, m *metrics.Metrics) processor.Config {
	k := a.cfg.Kafka
	return processor.Config{
		Brokers: brokers, Topics: k.Topics, Group: k.Group, ClientID: name,
		BatchMaxRecords: a.cfg.Batch.MaxRecords, BatchMaxBytes: a.cfg.Batch.MaxBytes, BatchLinger: a.cfg.Batch.Linger,
		Decode: processor.DecodeConfig{Format: processor.Format(a.cfg.Decode.Format), IDSource: processor.IDSource(a.cfg.Decode.EventIDSource),
			IDHeader: a.cfg.Decode.EventIDHeader, IDField: a.cfg.Decode.EventIDField, MaxBytes: a.cfg.Decode.MaxRecordBytes},
		DeadLetterTopic: k.DeadLetterTopic,
		CommitInterval:  k.CommitInterval, SessionTimeout: k.SessionTimeout, RebalanceTimeout: k.RebalanceTimeout,
		DrainTimeout: a.cfg.DrainTimeout, RetryBackoff: a.cfg.Batch.RetryBackoff, MaxRetryBackoff: a.cfg.Batch.MaxRetryBackoff,
		CallTimeout: a.cfg.Postgres.CallTimeout, ProduceTimeout: k.ProduceTimeout,
		OffsetOutOfRange: processor.OutOfRange(k.OffsetOutOfRange),
		Logger:           a.log, TracerProvider: tp, OnBatch: m.OnBatch,
		KafkaOptions: a.kafkaTracing(name),
	}
}
