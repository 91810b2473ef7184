package pipeline_test

import (
	"context"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/sink"
)

// A complete service: consume the payments topic and book each payment
// once into a ledger table, until SIGTERM drains it. It needs Kafka and
// Postgres, so it is not run as a test; examples/customhandler is a
// program that runs against an embedded Kafka.
func ExampleRun() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ledger := sink.HandlerFunc("ledger", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
		// pgtype.UUID, not uuid.UUID: arrays of it are also sent under the
		// exec and simple_protocol query modes (a transaction pooler).
		ids := make([]pgtype.UUID, len(events))
		payloads := make([]string, len(events))
		for i, e := range events {
			ids[i], payloads[i] = pgtype.UUID{Bytes: e.ID, Valid: true}, string(e.Value)
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id, payment)
			SELECT * FROM unnest($1::uuid[], $2::jsonb[])`, ids, payloads)
		return err
	})
	err := pipeline.Run(ctx, pipeline.Config{
		Brokers:         []string{"127.0.0.1:9092"},
		Topics:          []string{"payments"},
		Group:           "ledger",
		DeadLetterTopic: "payments.dlq",
		DSN:             os.Getenv("DATABASE_URL"),
		Handlers:        []sink.Handler{ledger},
		Migrate: func(ctx context.Context, pool *pgxpool.Pool, _ string) error {
			_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (event_id uuid NOT NULL, payment jsonb NOT NULL)`)
			return err
		},
		Logger: slog.Default(),
	})
	if err != nil {
		log.Fatal(err)
	}
}

// New validates first, so a service can refuse to start on a bad
// configuration before it serves anything; Ready then backs a readiness
// endpoint, and Metrics a Prometheus one.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	m := metrics.New()
	r, err := pipeline.New(pipeline.Config{
		Brokers:  []string{"127.0.0.1:9092"},
		Topics:   []string{"payments"},
		Group:    "ledger",
		DSN:      os.Getenv("DATABASE_URL"),
		Handlers: []sink.Handler{sink.HandlerFunc("ledger", bookPayments)},
		Metrics:  m,
	})
	if err != nil {
		log.Fatal(err) // every problem of the Config, each naming its field
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := r.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()

	err = r.Run(ctx) // drains when ctx ends
	_ = srv.Shutdown(context.Background())
	<-served
	if err != nil {
		log.Fatal(err)
	}
}

func bookPayments(ctx context.Context, tx pgx.Tx, events []sink.Event) error { return nil }
