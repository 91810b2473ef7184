package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/dedup"
)

// Config configures a Writer. Zero values take the defaults noted.
type Config struct {
	Schema   string    // Postgres schema holding sink's tables; default "public"
	Group    string    // consumer group; the sink_offsets key. Required.
	Bus      string    // the processed_events.bus value; default "kafka"
	Handlers []Handler // at least one; names must be unique and non-empty
	// Cache is the LRU fast path; nil disables it.
	Cache *dedup.Cache
	// TxTimeout bounds one transaction, COMMIT included; default 30s.
	TxTimeout time.Duration
	// SkipLogLimit is how many dedup.skip lines a batch logs at Info; the
	// rest are logged at Debug. Default 10.
	SkipLogLimit int
	// SkipEventLimit is how many skipped keys a batch records as span
	// events; the total is always an attribute. Default 32.
	SkipEventLimit int
	Logger         *slog.Logger         // nil discards
	TracerProvider trace.TracerProvider // nil disables tracing
}

// Writer writes partition batches to Postgres, one transaction each. It is
// safe for concurrent use by several partition workers; each call of Write
// is independent. The pool is owned by the caller.
type Writer struct {
	pool      *pgxpool.Pool
	cfg       Config
	tracer    trace.Tracer
	log       *slog.Logger
	processed string // sanitized, schema-qualified table names
	offsets   string
	dead      string
}

// New returns a Writer over pool. It does not touch the database; run
// Migrate first.
func New(pool *pgxpool.Pool, cfg Config) (*Writer, error) {
	if pool == nil {
		return nil, errors.New("sink: nil pool")
	}
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Bus == "" {
		cfg.Bus = "kafka"
	}
	if cfg.TxTimeout <= 0 {
		cfg.TxTimeout = 30 * time.Second
	}
	if cfg.SkipLogLimit == 0 {
		cfg.SkipLogLimit = 10
	}
	if cfg.SkipEventLimit == 0 {
		cfg.SkipEventLimit = 32
	}
	var problems []error
	if cfg.Group == "" {
		problems = append(problems, errors.New("sink: group is required"))
	}
	if len(cfg.Handlers) == 0 {
		problems = append(problems, errors.New("sink: at least one handler is required"))
	}
	seen := map[string]bool{}
	for _, h := range cfg.Handlers {
		switch name := h.Name(); {
		case name == "":
			problems = append(problems, errors.New("sink: a handler has an empty name"))
		case seen[name]:
			problems = append(problems, fmt.Errorf("sink: handler %q registered twice", name))
		default:
			seen[name] = true
		}
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	table := func(name string) string { return pgx.Identifier{cfg.Schema, name}.Sanitize() }
	return &Writer{
		pool:      pool,
		cfg:       cfg,
		tracer:    tp.Tracer("github.com/onceflow/onceflow/sink"),
		log:       log,
		processed: table("processed_events"),
		offsets:   table("sink_offsets"),
		dead:      table("dead_letters"),
	}, nil
}

// Handlers returns the names of the configured handlers, in order.
func (w *Writer) Handlers() []string {
	names := make([]string, len(w.cfg.Handlers))
	for i, h := range w.cfg.Handlers {
		names[i] = h.Name()
	}
	return names
}

// StoredOffsets returns the next offset stored in sink_offsets for each
// given partition of topic; partitions with no row are absent from the map.
func (w *Writer) StoredOffsets(ctx context.Context, topic string, partitions []int32) (map[int32]int64, error) {
	rows, err := w.pool.Query(ctx, `SELECT partition, next_offset FROM `+w.offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = ANY($3)`, w.cfg.Group, topic, partitions)
	if err != nil {
		return nil, fmt.Errorf("read stored offsets: %w", err)
	}
	out := make(map[int32]int64, len(partitions))
	var p int32
	var next int64
	_, err = pgx.ForEachRow(rows, []any{&p, &next}, func() error { out[p] = next; return nil })
	if err != nil {
		return nil, fmt.Errorf("read stored offsets: %w", err)
	}
	return out, nil
}

// pending is one (event, handler) pair that survived the cache.
type pending struct {
	key   dedup.Key
	event int // index into Batch.Events
}

// Write applies b in one transaction and returns what it did. On success the
// batch's effects, its dead letters and sink_offsets = b.NextOffset are
// committed, and the claimed keys are in the cache.
//
// Errors: a *FencedError (errors.Is ErrFenced) when the offset
// compare-and-set fails; otherwise the transaction's error, wrapped. On any
// error nothing is committed — unless COMMIT itself failed with an unknown
// outcome, in which case a retry of the same batch is fenced if it had in
// fact committed. The cache is only updated after a successful COMMIT.
// Write does not modify b; events a handler rejected are returned in
// Result.Rejected, already written to dead_letters.
func (w *Writer) Write(ctx context.Context, b *Batch) (Result, error) {
	var res Result
	// The fast path: drop keys known to be committed, without a round trip.
	var todo []pending
	var skipped []skip
	for i := range b.Events {
		for _, h := range w.cfg.Handlers {
			k := dedup.Key{EventID: b.Events[i].ID, Handler: h.Name()}
			if w.cfg.Cache.Seen(k) {
				skipped = append(skipped, skip{k, i, "lru"})
				continue
			}
			todo = append(todo, pending{k, i})
		}
	}
	res.SkippedLRU = len(skipped)

	var rejected []DeadLetter
	for {
		res.Attempts++
		claimedKeys, pgSkipped, err := w.attempt(ctx, b, todo, rejected)
		var reject *RejectError
		if errors.As(err, &reject) {
			var ok bool
			var dl DeadLetter
			if todo, dl, ok = w.reject(b, todo, reject); !ok {
				return res, fmt.Errorf("handler rejected event %s, which is not in the batch: %w", reject.EventID, err)
			}
			rejected = append(rejected, dl)
			continue
		}
		if err != nil {
			return res, err
		}
		// Committed. Every key claimed, and every key found already
		// claimed, is now known committed.
		known := make([]dedup.Key, 0, len(claimedKeys)+len(pgSkipped))
		known = append(known, claimedKeys...)
		for _, s := range pgSkipped {
			known = append(known, s.key)
		}
		w.cfg.Cache.Remember(known)
		skipped = append(skipped, pgSkipped...)
		res.Applied = len(claimedKeys)
		res.SkippedPostgres = len(pgSkipped)
		res.DeadLetters = len(b.DeadLetters) + len(rejected)
		res.Rejected = rejected
		w.logSkips(ctx, b, skipped)
		return res, nil
	}
}

type skip struct {
	key   dedup.Key
	event int
	layer string // lru | postgres
}

// reject moves the rejected event out of the batch's work into its dead
// letters.
func (w *Writer) reject(b *Batch, todo []pending, r *RejectError) ([]pending, DeadLetter, bool) {
	idx := -1
	todo = slices.DeleteFunc(todo, func(p pending) bool {
		if p.key.EventID == r.EventID {
			idx = p.event
			return true
		}
		return false
	})
	if idx < 0 {
		return todo, DeadLetter{}, false
	}
	e := b.Events[idx]
	dl := DeadLetter{
		Topic: e.Topic, Partition: e.Partition, Offset: e.Offset,
		EventID: uuid.NullUUID{UUID: e.ID, Valid: true},
		Reason:  "rejected: " + r.Reason, Value: e.Value,
	}
	w.log.Warn("event rejected", "topic", b.Topic, "partition", b.Partition,
		"event_id", r.EventID.String(), "reason", r.Reason)
	return todo, dl, true
}

// attempt runs one transaction: claim, handlers, dead letters (the
// batch's and those rejected so far), offset CAS, commit. It returns the keys claimed and the keys found already claimed.
func (w *Writer) attempt(ctx context.Context, b *Batch, todo []pending, rejected []DeadLetter) ([]dedup.Key, []skip, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	traceID := ""
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		traceID = sc.TraceID().String()
	}

	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	// Claim: one round trip for every (event, handler) left.
	keys := make([]dedup.Key, len(todo))
	for i, p := range todo {
		keys[i] = p.key
	}
	cctx, span := w.tracer.Start(ctx, "dedup.claim", trace.WithAttributes(attribute.Int("onceflow.keys", len(keys))))
	won, err := dedup.Claim(cctx, tx, w.processed, w.cfg.Bus, traceID, keys)
	endSpan(span, err)
	if err != nil {
		return nil, nil, err
	}
	perHandler := make(map[string][]Event, len(w.cfg.Handlers))
	var claimed []dedup.Key
	var already []skip
	for i, p := range todo {
		if won[i] {
			claimed = append(claimed, p.key)
			perHandler[p.key.Handler] = append(perHandler[p.key.Handler], b.Events[p.event])
		} else {
			already = append(already, skip{p.key, p.event, "postgres"})
		}
	}

	for _, h := range w.cfg.Handlers {
		events := perHandler[h.Name()]
		if len(events) == 0 {
			continue
		}
		hctx, span := w.tracer.Start(ctx, "handler "+h.Name(), trace.WithAttributes(
			attribute.String("onceflow.handler", h.Name()), attribute.Int("onceflow.events", len(events))))
		err := h.Apply(hctx, tx, events)
		endSpan(span, err)
		if err != nil {
			return nil, nil, fmt.Errorf("handler %s: %w", h.Name(), err)
		}
	}

	if err := w.insertDeadLetters(ctx, tx, append(slices.Clip(b.DeadLetters), rejected...)); err != nil {
		return nil, nil, err
	}

	octx, span := w.tracer.Start(ctx, "sink.offset_cas", trace.WithAttributes(
		attribute.Int64("onceflow.fence", b.Fence), attribute.Int64("onceflow.next_offset", b.NextOffset)))
	err = w.storeOffset(octx, tx, b)
	endSpan(span, err)
	if err != nil {
		return nil, nil, err
	}

	cctx, span = w.tracer.Start(ctx, "sink.commit")
	err = tx.Commit(cctx)
	endSpan(span, err)
	if err != nil {
		return nil, nil, fmt.Errorf("commit: %w", err)
	}
	return claimed, already, nil
}

// storeOffset is the fence: it moves sink_offsets from b.Fence to
// b.NextOffset, or inserts the row when none exists. Zero rows returned
// means another writer moved the offset.
func (w *Writer) storeOffset(ctx context.Context, tx pgx.Tx, b *Batch) error {
	var got int64
	err := tx.QueryRow(ctx, `INSERT INTO `+w.offsets+` AS o (consumer_group, topic, partition, next_offset)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
SET next_offset = EXCLUDED.next_offset, updated_at = now()
WHERE o.next_offset = $5
RETURNING o.next_offset`, w.cfg.Group, b.Topic, b.Partition, b.NextOffset, b.Fence).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return &FencedError{Group: w.cfg.Group, Topic: b.Topic, Partition: b.Partition, Fence: b.Fence}
	}
	if err != nil {
		return fmt.Errorf("store offset: %w", err)
	}
	return nil
}

func (w *Writer) insertDeadLetters(ctx context.Context, tx pgx.Tx, dls []DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	n := len(dls)
	topics, reasons := make([]string, n), make([]string, n)
	parts, offsets := make([]int32, n), make([]int64, n)
	ids := make([]pgtype.UUID, n) // binary encoding; uuid.NullUUID would be text
	keys, values := make([][]byte, n), make([][]byte, n)
	for i, d := range dls {
		topics[i], parts[i], offsets[i] = d.Topic, d.Partition, d.Offset
		ids[i] = pgtype.UUID{Bytes: d.EventID.UUID, Valid: d.EventID.Valid}
		reasons[i], keys[i], values[i] = d.Reason, d.Key, d.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+w.dead+`
(consumer_group, topic, partition, "offset", event_id, reason, record_key, record_value)
SELECT $1, d.* FROM unnest($2::text[], $3::int[], $4::bigint[], $5::uuid[], $6::text[], $7::bytea[], $8::bytea[])
  AS d(topic, partition, "offset", event_id, reason, record_key, record_value)
ON CONFLICT (consumer_group, topic, partition, "offset") DO NOTHING`,
		w.cfg.Group, topics, parts, offsets, ids, reasons, keys, values)
	if err != nil {
		return fmt.Errorf("insert dead letters: %w", err)
	}
	return nil
}

// logSkips logs dedup.skip for each skipped key (the first SkipLogLimit at
// Info, the rest at Debug) and records up to SkipEventLimit span events.
func (w *Writer) logSkips(ctx context.Context, b *Batch, skipped []skip) {
	if len(skipped) == 0 {
		return
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.Int("onceflow.skipped", len(skipped)))
	for i, s := range skipped {
		e := b.Events[s.event]
		level := slog.LevelInfo
		if i >= w.cfg.SkipLogLimit {
			level = slog.LevelDebug
		}
		if w.log.Enabled(ctx, level) {
			w.log.Log(ctx, level, "dedup.skip", "step", "dedup.skip", "event_id", s.key.EventID.String(),
				"bus", w.cfg.Bus, "handler", s.key.Handler, "layer", s.layer,
				"topic", e.Topic, "partition", e.Partition, "offset", e.Offset)
		}
		if i < w.cfg.SkipEventLimit {
			span.AddEvent("dedup.skip", trace.WithAttributes(
				attribute.String("onceflow.event_id", s.key.EventID.String()),
				attribute.String("onceflow.handler", s.key.Handler),
				attribute.String("onceflow.layer", s.layer)))
		}
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
