package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/processor"
)

type serveOptions struct {
	embeddedKafka bool
	partitions    int
}

func newServeCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP API, the outbox relay and the processor together",
		Long: `serve runs, in one process, the seed's HTTP API on http.addr:

  POST /events-outbox/{bus}     an order, with an Idempotency-Key header (a UUID):
                                the order and its outbox row in one transaction
  GET  /audit/event/{id}        outbox row, processed rows per handler, emails, dead letters
  POST /demo/replay-event/{id}  publish the event again with the same id (a broker redelivery)
  GET  /healthz, /readyz, /metrics

the outbox relay (outbox rows to kafka.topics[0]) and the processor.
--embedded-kafka runs an in-process Kafka instead of kafka.brokers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := load(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := startServe(ctx, a, o)
			if err != nil {
				return err
			}
			a.log.Info("serving", "addr", s.addr, "schema", a.cfg.Postgres.Schema)
			fmt.Fprintf(cmd.ErrOrStderr(), "onceflow serve: http://%s (POST /events-outbox/%s, GET /audit/event/{id}, POST /demo/replay-event/{id})\n",
				s.addr, a.cfg.Bus)
			return s.wait()
		},
	}
	cmd.Flags().BoolVar(&o.embeddedKafka, "embedded-kafka", false, "run an in-process Kafka (kfake) instead of connecting to kafka.brokers")
	cmd.Flags().IntVar(&o.partitions, "partitions", 3, "partitions of the topic, with --embedded-kafka")
	return cmd
}

// server is a running serve: the HTTP API, the relay and the processor.
type server struct {
	addr string
	wait func() error // returns when ctx has ended and everything stopped
}

func startServe(ctx context.Context, a *app, o serveOptions) (*server, error) {
	var closers []func()
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	ok := false
	defer func() {
		if !ok {
			cleanup()
		}
	}()
	shutdownTracing, err := a.startTracing(ctx)
	if err != nil {
		return nil, err
	}
	tp := a.tp
	closers = append(closers, func() { _ = shutdownTracing(context.WithoutCancel(ctx)) })
	pool, err := a.openPool(ctx, a.cfg.Postgres.PoolSize+1)
	if err != nil {
		return nil, err
	}
	closers = append(closers, pool.Close)
	schema := a.cfg.Postgres.Schema
	if err := migrate(ctx, pool, schema); err != nil {
		return nil, err
	}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		return nil, err
	}
	topic := a.cfg.Kafka.Topics[0]
	brokers := a.cfg.Kafka.Brokers
	if o.embeddedKafka {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(max(o.partitions, 1)), a.cfg.Kafka.Topics...),
			kfake.SeedTopics(1, a.cfg.Kafka.DeadLetterTopic))
		if err != nil {
			return nil, fmt.Errorf("embedded kafka: %w", err)
		}
		closers = append(closers, c.Close)
		brokers = c.ListenAddrs()
	}

	cache, err := dedup.New(a.cfg.Dedup.LRUSize)
	if err != nil {
		return nil, err
	}
	w, err := a.newWriter(pool, schema, cache, tp)
	if err != nil {
		return nil, err
	}
	m := metrics.New()
	cc := a.consumerConfig(brokers, a.cfg.Kafka.ClientID, tp, m)
	cc.KafkaOptions = append(cc.KafkaOptions, kgo.MetadataMinAge(time.Second))
	consumer, err := processor.New(cc, w)
	if err != nil {
		return nil, err
	}
	m.Add(consumer, cache)
	pcl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(a.cfg.Kafka.ClientID + "-relay"),
		kgo.ProducerLinger(2 * time.Millisecond)}, a.kafkaTracing(a.cfg.Kafka.ClientID+"-relay")...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	closers = append(closers, pcl.Close)
	relay, err := outbox.NewRelay(pool, pcl, outbox.RelayConfig{Schema: schema, Logger: a.log, TracerProvider: tp})
	if err != nil {
		return nil, err
	}
	store, err := outbox.NewStore(pool, outbox.StoreConfig{Schema: schema, Bus: a.cfg.Bus, Topic: topic, SamePayload: orders.Same})
	if err != nil {
		return nil, err
	}
	api := &api{store: store, relay: relay, pool: pool, schema: schema, handlers: a.cfg.Handlers,
		bus: a.cfg.Bus, topic: topic, tracer: tp.Tracer("github.com/onceflow/onceflow/cmd/onceflow")}
	mux := baseMux(m, pool)
	api.routes(mux)

	hctx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	addr, httpErr, err := serveHTTP(hctx, a.cfg.HTTP.Addr, mux)
	if err != nil {
		stopHTTP()
		return nil, err
	}

	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = consumer.Run(ctx) }()
	go func() { defer wg.Done(); errs[1] = relay.Run(ctx) }()
	ok = true
	return &server{addr: addr, wait: func() error {
		wg.Wait()
		stopHTTP()
		herr := <-httpErr
		cleanup()
		return errors.Join(errs[0], errs[1], herr)
	}}, nil
}

// api serves the seed's endpoints.
type api struct {
	store    *outbox.Store
	relay    *outbox.Relay
	pool     *pgxpool.Pool
	schema   string
	handlers []string
	bus      string
	topic    string
	tracer   trace.Tracer
}

func (h *api) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /events-outbox/{bus}", h.enqueue)
	mux.HandleFunc("GET /audit/event/{id}", h.audit)
	mux.HandleFunc("POST /demo/replay-event/{id}", h.replay)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...)})
}

// parseID accepts only a canonical UUID.
func parseID(s string) (uuid.UUID, bool) {
	id, err := uuid.Parse(s)
	return id, err == nil && len(s) == 36
}

func (h *api) enqueue(w http.ResponseWriter, r *http.Request) {
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := h.tracer.Start(ctx, "POST /events-outbox/{bus}", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	if bus := r.PathValue("bus"); bus != h.bus {
		writeError(w, http.StatusBadRequest, "bus %q is not served here: only %q is", bus, h.bus)
		return
	}
	rawKey := r.Header.Get("Idempotency-Key")
	if rawKey == "" {
		writeError(w, http.StatusBadRequest, "the Idempotency-Key header is required: a UUID the client chooses once per order and repeats on every retry")
		return
	}
	key, ok := parseID(rawKey)
	if !ok {
		writeError(w, http.StatusBadRequest, "Idempotency-Key %q is not a UUID (like 7f8a0000-0000-0000-0000-000000000001)", rawKey)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: %v", err)
		return
	}
	if len(body) > 1<<20 {
		writeError(w, http.StatusRequestEntityTooLarge, "body is over 1 MiB")
		return
	}
	o, err := orders.Parse(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "body: %v (want {\"user_id\":1,\"items\":[\"A\"]})", err)
		return
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	acc := struct {
		EventID  uuid.UUID `json:"event_id"`
		OrderID  int64     `json:"order_id"`
		Status   string    `json:"status"`
		Replayed bool      `json:"-"`
	}{EventID: key, Status: "accepted"}
	res, err := h.store.Enqueue(ctx, outbox.Event{ID: key, Payload: body, Traceparent: carrier["traceparent"]},
		func(ctx context.Context, tx pgx.Tx) (err error) {
			acc.OrderID, err = orders.Insert(ctx, tx, h.schema, key, o)
			return err
		})
	acc.Replayed = res.Replayed
	if err == nil && res.Replayed {
		acc.OrderID, err = orders.ID(ctx, h.pool, h.schema, key)
	}
	switch {
	case errors.Is(err, outbox.ErrKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key %s was already used with a different order", key)
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, "enqueue: %v", err)
		return
	}
	if acc.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, http.StatusOK, acc)
}

func (h *api) audit(w http.ResponseWriter, r *http.Request) {
	id, ok := parseID(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusBadRequest, "event id %q is not a UUID", r.PathValue("id"))
		return
	}
	ev, err := auditEvent(r.Context(), h.pool, h.schema, h.handlers, id)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "audit: %v", err)
		return
	}
	st, err := h.store.Status(r.Context(), id)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "audit: %v", err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		eventAudit
		Outbox outbox.Status `json:"outbox"`
	}{ev, st})
}

func (h *api) replay(w http.ResponseWriter, r *http.Request) {
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := h.tracer.Start(ctx, "POST /demo/replay-event/{id}", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	r = r.WithContext(ctx)
	id, ok := parseID(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusBadRequest, "event id %q is not a UUID", r.PathValue("id"))
		return
	}
	payload, err := h.store.Payload(r.Context(), id)
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(w, http.StatusNotFound, "no event %s in the outbox: POST it to /events-outbox/%s first", id, h.bus)
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "replay: %v", err)
		return
	}
	if err := h.relay.Publish(r.Context(), h.topic, id, payload); err != nil {
		writeError(w, http.StatusBadGateway, "publish to kafka: %v", err)
		return
	}
	if err := h.store.MarkRepublished(r.Context(), id); err != nil {
		writeError(w, http.StatusInternalServerError, "replay: %v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{
		"event_id": id.String(),
		"status":   "replayed",
		"note": strings.Join([]string{"event re-published to the broker with the same event_id;",
			"the consumer's dedup should skip it (check /audit/event/" + id.String() + ")"}, " "),
	})
}
