package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/wire"
)

// RelayConfig configures a Relay. Zero values take the defaults noted.
type RelayConfig struct {
	Schema    string        // schema of the outbox table; default "public"
	BatchSize int           // rows published per transaction; default 500
	Poll      time.Duration // wait when nothing is pending; default 100ms
	Logger    *slog.Logger  // nil discards
	// TracerProvider traces each publication as a producer span, child of
	// the request that enqueued it; nil disables tracing.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator // default W3C trace context
}

// Relay publishes outbox rows to Kafka. Several relays, in one process or
// many, may run over one table. The Kafka client is the caller's; it must
// be able to produce to the rows' topics. A Relay is safe for concurrent use.
type Relay struct {
	pool   *pgxpool.Pool
	cl     *kgo.Client
	cfg    RelayConfig
	table  string
	tracer trace.Tracer
	log    *slog.Logger

	afterPublish func() error // test hook: runs between publish and mark
}

// NewRelay returns a Relay over pool and cl.
func NewRelay(pool *pgxpool.Pool, cl *kgo.Client, cfg RelayConfig) *Relay {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 100 * time.Millisecond
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{pool: pool, cl: cl, cfg: cfg, table: pgx.Identifier{cfg.Schema, "outbox"}.Sanitize(),
		tracer: tp.Tracer("github.com/onceflow/onceflow/outbox"), log: log}
}

// Run relays until ctx ends, then returns nil. Errors are logged and
// retried after Poll.
func (r *Relay) Run(ctx context.Context) error {
	for {
		n, err := r.RelayOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.log.Warn("outbox relay", "err", err)
		}
		if n == r.cfg.BatchSize && err == nil {
			continue // more may be pending
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.Poll):
		}
	}
}

// RelayOnce publishes up to BatchSize unpublished rows, oldest first, and
// marks them published, returning how many. Rows locked by another relay
// are skipped. The rows stay locked while they are produced; if producing
// or marking fails, the transaction rolls back and they are published
// again later.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	rows, err := tx.Query(ctx, `SELECT id, event_id, topic, payload, coalesce(traceparent, '') FROM `+r.table+`
WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("select outbox rows: %w", err)
	}
	var (
		ids   []int64
		recs  []*kgo.Record
		spans []trace.Span
		id    int64
		event uuid.UUID
		topic string
		body  []byte
		tp    string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &event, &topic, &body, &tp}, func() error {
		ids = append(ids, id)
		rec, span := r.record(ctx, topic, event, body, tp)
		recs = append(recs, rec)
		spans = append(spans, span)
		return nil
	})
	defer func() {
		for _, s := range spans {
			s.End()
		}
	}()
	if err != nil {
		return 0, fmt.Errorf("read outbox rows: %w", err)
	}
	if len(recs) == 0 {
		return 0, nil
	}
	if err := r.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("publish %d outbox rows: %w", len(recs), err)
	}
	if r.afterPublish != nil {
		if err := r.afterPublish(); err != nil {
			return 0, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE `+r.table+` SET published_at = now(), publishes = publishes + 1 WHERE id = ANY($1)`, ids); err != nil {
		return 0, fmt.Errorf("mark outbox rows published: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit outbox marks: %w", err)
	}
	return len(recs), nil
}

// Publish publishes one event to topic now, outside the outbox: the demo's
// simulated broker redelivery. The record is exactly what the relay sends.
func (r *Relay) Publish(ctx context.Context, topic string, id uuid.UUID, payload []byte) error {
	rec, span := r.record(ctx, topic, id, payload, "")
	defer span.End()
	return r.cl.ProduceSync(ctx, rec).FirstErr()
}

// record builds the Kafka record of an event, with a span "outbox.relay"
// that is a child of traceparent (or of ctx), injected into its headers.
func (r *Relay) record(ctx context.Context, topic string, id uuid.UUID, payload []byte, traceparent string) (*kgo.Record, trace.Span) {
	if traceparent != "" {
		ctx = r.cfg.Propagator.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
	}
	ctx, span := r.tracer.Start(ctx, "outbox.relay", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.message.id", id.String())))
	rec := wire.NewRecord(topic, id, payload)
	// A tracing hook on the client (kotel) starts its publish span from
	// rec.Context and re-injects; without one, this span is the producer's.
	rec.Context = ctx
	r.cfg.Propagator.Inject(ctx, wire.RecordCarrier{Record: rec})
	return rec, span
}
