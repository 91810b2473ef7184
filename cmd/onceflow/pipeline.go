package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// newWriter builds the sink writer for schema from the config.
func (a *app) newWriter(pool *pgxpool.Pool, schema string, cache *dedup.Cache, tp trace.TracerProvider) (*sink.Writer, error) {
	hs, err := registry.build(schema, a.cfg.Handlers)
	if err != nil {
		return nil, err
	}
	return sink.New(pool, sink.Config{
		Schema: schema, Group: a.cfg.Kafka.Group, Bus: a.cfg.Bus, Handlers: hs, Cache: cache,
		TxTimeout: a.cfg.Postgres.TxTimeout, Logger: a.log, TracerProvider: tp,
	})
}

// consumerConfig builds a consumer's config; name is its client id.
func (a *app) consumerConfig(brokers []string, name string, tp trace.TracerProvider, m *metrics.Metrics) processor.Config {
	k := a.cfg.Kafka
	return processor.Config{
		Brokers: brokers, Topics: k.Topics, Group: k.Group, ClientID: name,
		BatchMaxRecords: a.cfg.Batch.MaxRecords, BatchMaxBytes: a.cfg.Batch.MaxBytes, BatchLinger: a.cfg.Batch.Linger,
		Decode:          processor.DecodeConfig{IDField: a.cfg.Decode.EventIDField, MaxBytes: a.cfg.Decode.MaxRecordBytes},
		DeadLetterTopic: k.DeadLetterTopic,
		CommitInterval:  k.CommitInterval, SessionTimeout: k.SessionTimeout, RebalanceTimeout: k.RebalanceTimeout,
		Logger: a.log, TracerProvider: tp, OnBatch: m.OnBatch,
		KafkaOptions: a.kafkaTracing(name),
	}
}

// serveHTTP serves mux on addr until ctx ends, then shuts down within 5s.
// It returns once listening, with the bound address; errc receives the
// server's error, if any.
func serveHTTP(ctx context.Context, addr string, mux *http.ServeMux) (string, <-chan error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("http.addr %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		errc <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr().String(), errc, nil
}

// baseMux serves /metrics, /healthz (the process is up) and /readyz
// (Postgres answers).
func baseMux(m *metrics.Metrics, pool *pgxpool.Pool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		if err := pool.Ping(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"status":"postgres does not answer"}` + "\n"))
			return
		}
		_, _ = w.Write([]byte(`{"status":"ready"}` + "\n"))
	})
	return mux
}

// abortOnSecondSignal aborts c (no commit, like a crash) if SIGINT or
// SIGTERM arrives again after ctx ended, until done closes.
func abortOnSecondSignal(ctx context.Context, a *app, c *processor.Consumer, done <-chan struct{}) {
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sig)
		select {
		case <-sig:
			a.log.Warn("second signal: aborting without committing")
			c.Abort()
		case <-done:
		}
	}()
}
