package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/wire"
)

// RelayConfig configures a Relay. Zero values take the defaults noted.
type RelayConfig struct {
	Schema    string        // schema of the outbox table; default "public"
	BatchSize int           // rows claimed and produced at once; default 500
	Poll      time.Duration // wait when nothing is pending, and after a first error; default 100ms
	// MaxBackoff is the longest wait between attempts while they keep
	// failing (Postgres or the brokers down): each failure doubles the
	// wait, from Poll up to MaxBackoff; a success goes back to Poll.
	// Default 30s.
	MaxBackoff time.Duration
	// ProduceTimeout bounds waiting for one claimed batch to be produced;
	// default 10s. Rows the client has not delivered by then stay the
	// relay's while the client holds them: their lease is renewed, and
	// they are marked once the client delivers or fails them.
	ProduceTimeout time.Duration
	// QueryTimeout bounds each Postgres round trip; default 5s.
	QueryTimeout time.Duration
	// Lease is how long claimed rows stay the relay's: another relay takes
	// them over only after it ran out. It must exceed ProduceTimeout plus
	// two QueryTimeouts; default 30s.
	Lease  time.Duration
	Logger *slog.Logger // nil discards
	// TracerProvider traces each publication as a producer span, child of
	// the request that enqueued it; nil disables tracing.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator // default W3C trace context
}

// Relay publishes outbox rows to Kafka. Several relays, in one process or
// many, may run over one table. The Kafka client is the caller's, who
// closes it after Run returns; it must be able to produce to the rows'
// topics. A Relay is safe for concurrent use.
type Relay struct {
	pool   *pgxpool.Pool
	cl     *kgo.Client
	cfg    RelayConfig
	table  string
	owner  uuid.UUID // this relay's id in lease_owner
	tracer trace.Tracer
	log    *slog.Logger

	afterPublish func() error // test hook: runs between produce and mark, as a relay dying there

	// held are the rows the client still held when a pass stopped waiting
	// for them (wire.ErrStillProducing), by id, until a pass marks how
	// they settled; see hold and settled. heldMu guards the three maps.
	heldMu sync.Mutex
	held   map[int64]*heldRow
	purged map[string]time.Time // topic -> when noteRecreated last purged it
	// given are rows this relay's client gave up, released for other
	// relays: this one leaves them out of its claims until the time given
	// (one lease), rather than take them straight back.
	given map[int64]time.Time
	// sleep waits d or until ctx ends, reporting whether d passed; a test
	// hook (default sleepCtx).
	sleep func(ctx context.Context, d time.Duration) bool
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// NewRelay returns a Relay over pool and cl, or an error naming every
// problem with cfg.
func NewRelay(pool *pgxpool.Pool, cl *kgo.Client, cfg RelayConfig) (*Relay, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 500
	}
	def(&cfg.Poll, 100*time.Millisecond)
	def(&cfg.MaxBackoff, 30*time.Second)
	def(&cfg.ProduceTimeout, 10*time.Second)
	def(&cfg.QueryTimeout, 5*time.Second)
	def(&cfg.Lease, 30*time.Second)
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	if err := cfg.validate(pool, cl); err != nil {
		return nil, err
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{pool: pool, cl: cl, cfg: cfg, table: pgx.Identifier{cfg.Schema, "outbox"}.Sanitize(), owner: uuid.New(),
		tracer: tp.Tracer("github.com/onceflow/onceflow/outbox"), log: log, sleep: sleepCtx,
		held: map[int64]*heldRow{}, purged: map[string]time.Time{}, given: map[int64]time.Time{}}, nil
}

func (cfg RelayConfig) validate(pool *pgxpool.Pool, cl *kgo.Client) error {
	var ps []error
	bad := func(format string, args ...any) { ps = append(ps, fmt.Errorf("outbox relay: "+format, args...)) }
	if pool == nil {
		bad("nil pool")
	}
	if cl == nil {
		bad("nil kafka client")
	}
	if cfg.BatchSize < 1 || cfg.BatchSize > 100000 {
		bad("batch size %d is not 1..100000", cfg.BatchSize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"poll", cfg.Poll}, {"max backoff", cfg.MaxBackoff}, {"produce timeout", cfg.ProduceTimeout}, {"query timeout", cfg.QueryTimeout}} {
		if d.v < 0 {
			bad("%s %v is negative", d.name, d.v)
		}
	}
	if cfg.MaxBackoff < cfg.Poll {
		bad("max backoff %v is shorter than poll %v", cfg.MaxBackoff, cfg.Poll)
	}
	if cfg.Lease <= cfg.ProduceTimeout+2*cfg.QueryTimeout {
		bad("lease %v must exceed the produce timeout plus two query timeouts (%v)", cfg.Lease, cfg.ProduceTimeout+2*cfg.QueryTimeout)
	}
	return errors.Join(ps...)
}

// warnEvery is how much waiting between failed attempts Run lets pass
// before it warns again that they keep failing.
const warnEvery = time.Minute

// Run relays until ctx ends, then returns nil. A failed attempt is retried
// after a wait that doubles with each failure in a row, from Poll up to
// MaxBackoff. Run warns at the first failure, then again after each
// minute spent failing, waits and attempts (with the attempts so far and
// the latest error), and
// logs at info level when an attempt succeeds again.
func (r *Relay) Run(ctx context.Context) error {
	failures := 0
	var wait, unwarned time.Duration
	for {
		began := time.Now()
		claimed, _, err := r.relay(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err != nil:
			failures++
			wait = min(max(2*wait, r.cfg.Poll), r.cfg.MaxBackoff)
		case failures > 0:
			r.log.Info("outbox relay: publishing again", "failed_attempts", failures)
			failures, wait, unwarned = 0, 0, 0
		}
		if claimed == r.cfg.BatchSize && err == nil {
			continue // more may be pending
		}
		sleep := max(wait, r.cfg.Poll)
		if r.holding() {
			sleep = min(sleep, r.cfg.Lease/3) // the next pass renews their lease
		}
		if err != nil {
			if failures == 1 || unwarned >= warnEvery {
				r.log.Warn("outbox relay: cannot publish; retrying", "err", err, "attempts", failures, "retry_in", sleep)
				unwarned = 0
			}
			unwarned += sleep + time.Since(began) // an attempt may take ProduceTimeout
		}
		if !r.sleep(ctx, sleep) {
			return nil
		}
	}
}

// RelayOnce publishes up to BatchSize pending rows, oldest first, and
// returns how many it published. Three steps, none holding a transaction
// or a row lock while another runs:
//
//  1. claim: rows neither published, failed nor leased to another relay
//     get a lease of Lease (one statement, SKIP LOCKED, committed);
//  2. produce them, within ProduceTimeout;
//  3. mark: published rows get published_at, rows the broker refused
//     (too large, invalid: [Refused]) get failed_at and fail_reason and are
//     not tried again, and the lease of rows that failed otherwise is
//     released so the next pass retries them.
//
// A row still in the client when ProduceTimeout ran out (a broker that
// went silent mid-produce) stays this relay's: each pass renews its lease
// (for maxHoldLeases leases at most) and leaves it out of its claim until
// the client delivers or fails it, and the pass after that marks it as
// step 3 does (a delivered row counts among the rows published). Producing
// it again while the client still holds it would put a second copy on the
// topic once the broker answers. While BatchSize rows or more are held, a
// pass claims nothing (an error says so): the rows behind them wait in the
// outbox, not in the client.
//
// A relay that dies between 1 and 3, or stops while the client holds
// rows, leaves them leased; once the lease runs out another relay
// publishes them again, a duplicate the consumer side absorbs. The error
// reports rows that could not be published and will be retried; refused
// rows are logged, not returned.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	_, published, err := r.relay(ctx)
	return published, err
}

// OldestPending returns the age, by Postgres' clock, of the oldest outbox
// row neither published nor refused by the broker (leased rows count: they
// are not on the topic yet), or 0 when there is none. Rows are published in
// id order, so this is the row at the head of the queue. It reads one row
// of an index, within QueryTimeout. Metrics export it: a relay that is
// stuck, or not running at all, shows as an age that only grows.
func (r *Relay) OldestPending(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var secs float64
	err := r.pool.QueryRow(ctx, `SELECT coalesce((SELECT extract(epoch FROM clock_timestamp() - created_at) FROM `+r.table+`
  WHERE published_at IS NULL AND failed_at IS NULL ORDER BY id LIMIT 1), 0)::float8`).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("oldest pending outbox row: %w", err)
	}
	return time.Duration(max(secs, 0) * float64(time.Second)), nil
}

// pendingRow is one claimed outbox row.
type pendingRow struct {
	id          int64
	event       uuid.UUID
	topic       string
	payload     []byte
	traceparent string
}

// heldRow is a row the client held when its pass stopped waiting: its
// span ends when the client settles it.
type heldRow struct {
	row     pendingRow
	since   time.Time
	span    trace.Span
	settled bool
	err     error // the client's outcome, once settled
}

// maxHoldLeases is for how many leases a relay renews the lease of a row
// its client still holds. Past that (the relay's link to the brokers cut
// while another relay's is not), the lease is left to run out, and
// another relay may take the row over and publish it, a copy the consumer
// side skips, rather than wait for this relay's link for ever.
const maxHoldLeases = 4

func (r *Relay) relay(ctx context.Context) (claimed, published int, err error) {
	var m marks
	settled, holding, renew := r.heldRows()
	if len(settled)+len(holding) > 0 {
		// The rows the client settled since the last pass are marked, and
		// the lease of those it holds renewed, before anything is claimed.
		var failed *heldRow // the first of them, logged for all
		for _, h := range settled {
			if err := r.sortOutcome(&m, h.row, h.err); err != nil && failed == nil {
				failed = h
			}
			r.noteRecreated(h.row.topic, h.err)
		}
		m.renew = renew
		if err := r.mark(ctx, m); err != nil {
			return 0, 0, err
		}
		r.forget(settled)
		r.give(m.retry)
		if failed != nil {
			// One line a pass: a broker that came back after a long
			// stall settles thousands of rows at once.
			r.log.Warn("outbox rows failed after the produce timeout: retrying", "rows", len(m.retry),
				"event_id", failed.row.event, "topic", failed.row.topic, "err", failed.err)
		}
		published, m = len(m.ok), marks{renew: renew}
		if len(holding) >= r.cfg.BatchSize {
			// A batch's worth is still in the client (a broker that does
			// not answer): what is pending waits in the outbox, where
			// another relay may take it, rather than in this client.
			return 0, published, fmt.Errorf("%w: not claiming more until it settles them", r.stillHeld(len(holding)))
		}
	}
	rows, err := r.claim(ctx, append(holding, r.givenRows()...))
	if err == nil && len(rows) == 0 && len(holding) > 0 {
		// Nothing else to do, but the brokers have not answered yet: no
		// success to report.
		return 0, published, r.stillHeld(len(holding))
	}
	if err != nil || len(rows) == 0 {
		return 0, published, err
	}
	recs := make([]*kgo.Record, len(rows))
	spans := make([]trace.Span, len(rows))
	for i, row := range rows {
		recs[i], spans[i] = r.record(ctx, row.topic, row.event, row.payload, row.traceparent)
	}
	outcome := wire.ProduceThen(ctx, r.cl, recs, r.cfg.ProduceTimeout, func(i int, err error) { r.settled(rows[i], err) })
	var (
		firstErr   error
		firstTopic string // firstErr's row's
	)
	for i, err := range outcome {
		if errors.Is(err, wire.ErrStillProducing) {
			// The client still holds it: kept, its lease renewed, until
			// it settles (its span ends then).
			r.hold(rows[i], spans[i])
			m.renew = append(m.renew, rows[i].id)
		} else {
			endSpan(spans[i], err)
		}
		if err := r.sortOutcome(&m, rows[i], err); err != nil && firstErr == nil {
			firstErr, firstTopic = err, rows[i].topic
		}
		r.noteRecreated(rows[i].topic, err)
	}
	if r.afterPublish != nil {
		if err := r.afterPublish(); err != nil {
			return len(rows), published, err
		}
	}
	if err := r.mark(ctx, m); err != nil {
		return len(rows), published, err
	}
	published += len(m.ok)
	if firstErr != nil {
		return len(rows), published, fmt.Errorf("publish %d outbox rows: %d published, %d refused, the rest left for later: topic %s: %w",
			len(rows), len(m.ok), len(m.refused), firstTopic, firstErr)
	}
	return len(rows), published, nil
}

// noteRecreated makes the client forget topic when err says the brokers
// do not know the topic id it produces with: the topic was deleted, and
// perhaps created again under its name. franz-go keeps a topic's first id
// for the client's life, failing every produce to the new topic, until the
// topic is purged from producing; then it learns the new id. The rows
// refused so are released, and produced again at a later pass.
func (r *Relay) noteRecreated(topic string, err error) {
	if !errors.Is(err, kerr.UnknownTopicID) {
		return
	}
	r.heldMu.Lock()
	recent := time.Since(r.purged[topic]) < r.cfg.ProduceTimeout
	if !recent {
		r.purged[topic] = time.Now()
	}
	r.heldMu.Unlock() // the purge fails the topic's records, whose promises take it
	if recent {
		return // purged for another of its rows just now
	}
	r.log.Warn("outbox topic deleted, perhaps recreated under the same name (its topic id is unknown to the brokers): "+
		"the client forgets it and learns it again", "topic", topic)
	r.cl.PurgeTopicsFromProducing(topic)
}

// sortOutcome adds row to what m marks by the client's outcome err, and
// returns err when the row is left for later (still in the client, or
// failed and to be retried); a refused row is logged.
func (r *Relay) sortOutcome(m *marks, row pendingRow, err error) error {
	switch {
	case err == nil:
		m.ok = append(m.ok, row.id)
	case errors.Is(err, wire.ErrStillProducing):
		// Renewed by the caller, which holds it.
	case Refused(err):
		m.refused = append(m.refused, refusal{row.id, err.Error()})
		r.log.Warn("outbox row refused by the broker: marked failed", "event_id", row.event, "topic", row.topic,
			"bytes", len(row.payload), "err", err)
		return nil
	default:
		m.retry = append(m.retry, row.id)
	}
	return err
}

// hold keeps row, which the client still holds, until a pass marks it;
// the client may have settled it already (see settled).
func (r *Relay) hold(row pendingRow, span trace.Span) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	h := r.heldEntry(row)
	h.span = span
	if h.settled {
		endSpan(span, h.err)
	}
}

// settled records the client's late outcome of row; it runs on the
// client's promise goroutine, possibly before the pass that produced row
// has held it.
func (r *Relay) settled(row pendingRow, err error) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	h := r.heldEntry(row)
	h.settled, h.err = true, err
	if h.span != nil {
		endSpan(h.span, err)
	}
}

// heldEntry is row's entry in held, made if there is none; r.heldMu is
// held.
func (r *Relay) heldEntry(row pendingRow) *heldRow {
	h, ok := r.held[row.id]
	if !ok {
		h = &heldRow{row: row, since: time.Now()}
		r.held[row.id] = h
	}
	return h
}

// heldRows returns the held rows the client has settled, the ids of those
// it still holds (which the relay does not claim again), and of those
// whose lease it renews: held for less than maxHoldLeases leases.
func (r *Relay) heldRows() (settled []*heldRow, holding, renew []int64) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	for id, h := range r.held {
		switch {
		case h.settled:
			settled = append(settled, h)
		case time.Since(h.since) < maxHoldLeases*r.cfg.Lease:
			renew = append(renew, id)
			fallthrough
		default:
			holding = append(holding, id)
		}
	}
	return settled, holding, renew
}

// give leaves the rows of ids, whose lease this relay released after its
// client gave them up past the produce timeout (a link to the brokers that
// went silent), to other relays for a lease: this relay would otherwise
// take them straight back in the same pass, pass after pass, out of a
// healthy relay's reach. A row failing within the timeout is claimed again
// after the backoff, which leaves other relays room.
func (r *Relay) give(ids []int64) {
	if len(ids) == 0 {
		return
	}
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	until := time.Now().Add(r.cfg.Lease)
	for _, id := range ids {
		r.given[id] = until
	}
}

// givenRows returns the rows give left to other relays whose time is not
// over, and forgets the others.
func (r *Relay) givenRows() []int64 {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	var ids []int64
	now := time.Now()
	for id, until := range r.given {
		if now.After(until) {
			delete(r.given, id)
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

// stillHeld says that n rows are still in the client, naming the topic of
// one of them.
func (r *Relay) stillHeld(n int) error {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	topic := ""
	for _, h := range r.held {
		if !h.settled {
			topic = h.row.topic
			break
		}
	}
	return fmt.Errorf("%d outbox rows still in the kafka client after the produce timeout (topic %s)", n, topic)
}

// holding reports whether the client holds rows whose lease this relay
// renews.
func (r *Relay) holding() bool {
	_, _, renew := r.heldRows()
	return len(renew) > 0
}

// forget drops held rows once their outcome is marked.
func (r *Relay) forget(rows []*heldRow) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	for _, h := range rows {
		delete(r.held, h.row.id)
	}
}

// claim leases up to BatchSize pending rows, oldest first, in one
// committed statement; the rows of skip (held by this relay's client) are
// not taken, whatever their lease.
func (r *Relay) claim(ctx context.Context, skip []int64) ([]pendingRow, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	if skip == nil {
		skip = []int64{}
	}
	rows, err := r.pool.Query(ctx, `UPDATE `+r.table+` SET lease_until = now() + $2 * interval '1 microsecond', lease_owner = $4
WHERE id IN (SELECT id FROM `+r.table+`
  WHERE published_at IS NULL AND failed_at IS NULL AND (lease_until IS NULL OR lease_until < now())
    AND id <> ALL($3::bigint[])
  ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, event_id, topic, payload, coalesce(traceparent, '')`, r.cfg.BatchSize, r.cfg.Lease.Microseconds(), skip, r.owner)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	var out []pendingRow
	var p pendingRow
	if _, err := pgx.ForEachRow(rows, []any{&p.id, &p.event, &p.topic, &p.payload, &p.traceparent}, func() error {
		out = append(out, p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	slices.SortFunc(out, func(a, b pendingRow) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

type refusal struct {
	id     int64
	reason string
}

// marks are what a pass records of its rows.
type marks struct {
	ok      []int64   // delivered: published
	refused []refusal // refused by the broker: failed
	retry   []int64   // failed otherwise: the lease released
	renew   []int64   // still in the client: the lease renewed
}

// mark records m, in one round trip. A row delivered or refused is marked
// whoever holds its lease (it is on the topic, or no relay can put it
// there); a lease is released or renewed only where this relay holds it:
// a row whose lease ran out before this relay's client settled it may
// be another relay's by now.
func (r *Relay) mark(ctx context.Context, m marks) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var b pgx.Batch
	if len(m.ok) > 0 {
		b.Queue(`UPDATE `+r.table+` SET published_at = now(), publishes = publishes + 1, lease_until = NULL, lease_owner = NULL
WHERE id = ANY($1)`, m.ok)
	}
	if len(m.refused) > 0 {
		ids := make([]int64, len(m.refused))
		reasons := make([]string, len(m.refused))
		for i, f := range m.refused {
			ids[i], reasons[i] = f.id, f.reason
		}
		b.Queue(`UPDATE `+r.table+` AS o SET failed_at = now(), fail_reason = f.reason, lease_until = NULL, lease_owner = NULL
FROM unnest($1::bigint[], $2::text[]) AS f(id, reason) WHERE o.id = f.id`, ids, reasons)
	}
	if len(m.retry) > 0 {
		b.Queue(`UPDATE `+r.table+` SET lease_until = NULL, lease_owner = NULL WHERE id = ANY($1) AND lease_owner = $2`, m.retry, r.owner)
	}
	if len(m.renew) > 0 {
		b.Queue(`UPDATE `+r.table+` SET lease_until = now() + $2 * interval '1 microsecond'
WHERE id = ANY($1) AND lease_owner = $3 AND published_at IS NULL AND failed_at IS NULL`, m.renew, r.cfg.Lease.Microseconds(), r.owner)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := r.pool.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("mark %d outbox rows published, %d failed: %w", len(m.ok), len(m.refused), err)
	}
	return nil
}

// Refused reports whether err is the broker's (or the client's) refusal of
// a record that no retry can change: too large, or invalid.
func Refused(err error) bool {
	for _, e := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.InvalidTopicException} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Publish publishes one event to topic now, outside the outbox, within
// ProduceTimeout: the demo's simulated broker redelivery. The record is
// exactly what the relay sends.
func (r *Relay) Publish(ctx context.Context, topic string, id uuid.UUID, payload []byte) error {
	rec, span := r.record(ctx, topic, id, payload, "")
	err := wire.Produce(ctx, r.cl, []*kgo.Record{rec}, r.cfg.ProduceTimeout)[0]
	endSpan(span, err)
	return err
}

// record builds the Kafka record of an event, with a span "outbox.relay"
// that is a child of traceparent (or of ctx), injected into its headers.
// The caller ends the span.
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

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
