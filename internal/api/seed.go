package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sink"
)

// maxBody is the largest order body accepted.
const maxBody = 1 << 20

// Publisher publishes one event to topic now, with id as its event id:
// what the replay endpoint needs. *outbox.Relay implements it.
type Publisher interface {
	Publish(ctx context.Context, topic string, id uuid.UUID, payload []byte) error
}

// SeedConfig configures the seed's endpoints. Every field but
// TracerProvider is required.
type SeedConfig struct {
	Pool      *pgxpool.Pool
	Store     *outbox.Store // the outbox the orders' events enter
	Publisher Publisher     // publishes replays
	Schema    string        // where the orders, outbox and sink tables are
	Bus       string        // the only bus served
	Topic     string        // where replays are published
	// Handlers orders the processed rows of an audit.
	Handlers []string
	// Horizon is the dedup retention (dedup.retention), from which an
	// audit's retained_until is computed; 0: unlimited.
	Horizon        time.Duration
	TracerProvider trace.TracerProvider // nil: no spans
	// Logger receives the failures that are not the caller's (a 5xx);
	// nil: discard.
	Logger *slog.Logger
}

// Seed serves the seed's endpoints. It is safe for concurrent use.
type Seed struct {
	cfg    SeedConfig
	tracer trace.Tracer
	log    *slog.Logger
}

// NewSeed returns the seed's endpoints over cfg, or an error naming every
// missing field.
func NewSeed(cfg SeedConfig) (*Seed, error) {
	var ps []error
	for _, f := range []struct {
		name    string
		missing bool
	}{{"Pool", cfg.Pool == nil}, {"Store", cfg.Store == nil}, {"Publisher", cfg.Publisher == nil},
		{"Schema", cfg.Schema == ""}, {"Bus", cfg.Bus == ""}, {"Topic", cfg.Topic == ""}} {
		if f.missing {
			ps = append(ps, fmt.Errorf("api: SeedConfig.%s is required", f.name))
		}
	}
	if err := errors.Join(ps...); err != nil {
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
	return &Seed{cfg: cfg, tracer: tp.Tracer("github.com/onceflow/onceflow/internal/api"), log: log}, nil
}

// Register adds the seed's routes to mux. Every answer is JSON, an error
// an object whose error field names the problem: 4xx for what the caller
// sent (405 for a method a route does not serve), 503 with Retry-After
// when Postgres is unavailable, 502 when the broker refuses a replay, and
// 500 only for a fault of the server (see classify).
func (s *Seed) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /events-outbox/{bus}", s.enqueue)
	mux.HandleFunc("GET /audit/event/{id}", s.audit)
	mux.HandleFunc("POST /demo/replay-event/{id}", s.replay)
	mux.HandleFunc("/events-outbox/{bus}", methodNotAllowed("/events-outbox/{bus}", "POST"))
	mux.HandleFunc("/audit/event/{id}", methodNotAllowed("/audit/event/{id}", "GET, HEAD"))
	mux.HandleFunc("/demo/replay-event/{id}", methodNotAllowed("/demo/replay-event/{id}", "POST"))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...)})
}

// ParseID accepts only a canonical UUID, as event ids and Idempotency-Keys
// must be.
func ParseID(s string) (uuid.UUID, bool) {
	id, err := uuid.Parse(s)
	return id, err == nil && len(s) == 36
}

// startSpan starts a server span that continues the client's trace.
func (s *Seed) startSpan(r *http.Request, name string) (context.Context, trace.Span) {
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
}

// accepted is the answer to an enqueued order; the same for every request
// with one key.
type accepted struct {
	EventID uuid.UUID `json:"event_id"`
	OrderID int64     `json:"order_id"`
	Status  string    `json:"status"` // "accepted"
}

// enqueue writes the order and its outbox row in one transaction, the
// Idempotency-Key as the event id. The body is the order's JSON whatever
// the content type says (curl -d sends a form's), and must be what Postgres
// can store as jsonb: what the consumer's events relation holds.
func (s *Seed) enqueue(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.startSpan(r, "POST /events-outbox/{bus}")
	defer span.End()
	key, body, o, ok := s.readOrder(w, r)
	if !ok {
		return
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	ans := accepted{EventID: key, Status: "accepted"}
	res, err := s.cfg.Store.Enqueue(ctx, outbox.Event{ID: key, Payload: body, Traceparent: carrier["traceparent"]},
		func(ctx context.Context, tx pgx.Tx) (err error) {
			if _, err := tx.Exec(ctx, storable, string(body)); err != nil {
				return fmt.Errorf("body as jsonb: %w", err)
			}
			ans.OrderID, err = orders.Insert(ctx, tx, s.cfg.Schema, key, o)
			return err
		})
	if err == nil && res.Replayed {
		ans.OrderID, err = orders.ID(ctx, s.cfg.Pool, s.cfg.Schema, key)
	}
	switch {
	case errors.Is(err, outbox.ErrKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key %s was already used with a different order", key)
		return
	case err != nil:
		s.fail(w, r, "order", err, true)
		return
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, http.StatusOK, ans)
}

// readOrder checks the bus, the Idempotency-Key and the body; on a problem
// it answers and returns false.
func (s *Seed) readOrder(w http.ResponseWriter, r *http.Request) (uuid.UUID, []byte, orders.Order, bool) {
	var o orders.Order
	if bus := r.PathValue("bus"); bus != s.cfg.Bus {
		writeError(w, http.StatusBadRequest, "bus %s is not served here: only %q is", short(bus), s.cfg.Bus)
		return uuid.Nil, nil, o, false
	}
	rawKey := r.Header.Get("Idempotency-Key")
	if keys := r.Header.Values("Idempotency-Key"); len(keys) > 1 && slices.ContainsFunc(keys, func(k string) bool { return !strings.EqualFold(k, rawKey) }) {
		writeError(w, http.StatusBadRequest, "the Idempotency-Key header is given %d times with different values: send one key", len(keys))
		return uuid.Nil, nil, o, false
	}
	if rawKey == "" {
		writeError(w, http.StatusBadRequest, "the Idempotency-Key header is required: a UUID the client chooses once per order and repeats on every retry")
		return uuid.Nil, nil, o, false
	}
	key, ok := ParseID(rawKey)
	if !ok {
		writeError(w, http.StatusBadRequest, "Idempotency-Key %s is not a UUID (like 7f8a0000-0000-0000-0000-000000000001)", short(rawKey))
		return uuid.Nil, nil, o, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: %v", err)
		return uuid.Nil, nil, o, false
	}
	if len(body) > maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, "body is over 1 MiB")
		return uuid.Nil, nil, o, false
	}
	if err := checkBody(body); err != nil {
		writeError(w, http.StatusBadRequest, "%v (want an order like {\"user_id\":1,\"items\":[\"A\"]})", err)
		return uuid.Nil, nil, o, false
	}
	if o, err = orders.Parse(body); err != nil {
		writeError(w, http.StatusBadRequest, "body: %v (want {\"user_id\":1,\"items\":[\"A\"]})", err)
		return uuid.Nil, nil, o, false
	}
	return key, body, o, true
}

func (s *Seed) audit(w http.ResponseWriter, r *http.Request) {
	id, ok := ParseID(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusBadRequest, "event id %s is not a UUID", short(r.PathValue("id")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	ev, err := Audit(ctx, s.cfg.Pool, s.cfg.Store, s.cfg.Schema, s.cfg.Handlers, s.cfg.Horizon, id)
	if errors.Is(err, ErrNotSeen) {
		writeError(w, http.StatusNotFound, "%v", err)
		return
	}
	if err != nil {
		s.fail(w, r, "audit", err, false)
		return
	}
	writeJSON(w, http.StatusOK, ev)
}

// replay publishes an enqueued event again, with the same id: a simulated
// broker redelivery, which the consumer's dedup must skip. With an order
// as the request body, that order is published instead: a producer that
// reused the id for another payload, which the consumer dead-letters as a
// conflict while the first version's effects stand.
func (s *Seed) replay(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.startSpan(r, "POST /demo/replay-event/{id}")
	defer span.End()
	id, ok := ParseID(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusBadRequest, "event id %s is not a UUID", short(r.PathValue("id")))
		return
	}
	payload, err := s.cfg.Store.Payload(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(w, http.StatusNotFound, "no event %s in the outbox: POST it to /events-outbox/%s first", id, s.cfg.Bus)
		return
	}
	if err != nil {
		s.fail(w, r, "replay", err, false)
		return
	}
	other, ok := s.replayBody(ctx, w, r)
	if !ok {
		return
	}
	conflict := other != nil && !bytes.Equal(other, payload)
	if other != nil {
		payload = other
	}
	if err := s.cfg.Publisher.Publish(ctx, s.cfg.Topic, id, payload); err != nil {
		if outbox.Refused(err) {
			// No retry changes it: the broker refuses this record.
			writeError(w, http.StatusUnprocessableEntity, "kafka refuses the event (%v): it cannot be published, so not replayed either", err)
			return
		}
		writeError(w, http.StatusBadGateway, "publish to kafka: %v", err)
		return
	}
	if err := s.cfg.Store.MarkRepublished(ctx, id); err != nil {
		s.fail(w, r, "replay", err, false)
		return
	}
	if conflict {
		writeJSON(w, http.StatusOK, map[string]string{
			"event_id": id.String(),
			"status":   "replayed with another payload",
			"expect":   "conflict",
			"note": "event re-published with the same event_id and a different payload: the consumer dead-letters it " +
				"with reason \"" + sink.ReasonConflict + "\" and the first version's effects stand " +
				"(check \"conflict\": true in /audit/event/" + id.String() + ")",
		})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{
		"event_id": id.String(),
		"status":   "replayed",
		"expect":   "skip",
		"note": "event re-published to the broker with the same event_id; " +
			"the consumer's dedup should skip it (check /audit/event/" + id.String() + ")",
	})
}

// replayBody reads the optional order a replay publishes instead of the
// stored one: nil when the body is empty. Like an enqueued order, it must
// be one Postgres can store. On a problem it answers and returns false.
func (s *Seed) replayBody(ctx context.Context, w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	switch {
	case err != nil:
		writeError(w, http.StatusBadRequest, "read body: %v", err)
		return nil, false
	case len(body) > maxBody:
		writeError(w, http.StatusRequestEntityTooLarge, "body is over 1 MiB")
		return nil, false
	case len(bytes.TrimSpace(body)) == 0:
		return nil, true
	}
	const want = `want an order to publish under the same id, like {"user_id":2,"items":["B"]}, or no body to publish the stored one`
	if err := checkBody(body); err != nil {
		writeError(w, http.StatusBadRequest, "%v (%s)", err, want)
		return nil, false
	}
	if _, err := orders.Parse(body); err != nil {
		writeError(w, http.StatusBadRequest, "body: %v (%s)", err, want)
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := s.cfg.Pool.Exec(ctx, storable, string(body)); err != nil {
		s.fail(w, r, "body as jsonb", err, true)
		return nil, false
	}
	return body, true
}
