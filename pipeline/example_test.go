package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// A complete service: consume the payments topic and book each payment
// once into a ledger table, in the batch's transaction; what is not a
// payment becomes a dead letter. A service runs until SIGTERM drains it
// (its ctx from signal.NotifyContext). This one runs against an
// in-process Kafka (kfake) holding four records — the second payment
// delivered twice, as a producer's retry sends it, and last a record that
// is no payment — and stops once that one is dead-lettered. Postgres is
// the database of ONCEFLOW_TEST_POSTGRES_DSN, else the local one
// infra/postgres.sh starts; the example's tables live in a schema of
// their own, dropped at the end.
func ExampleRun() {
	dsn := os.Getenv("ONCEFLOW_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow?sslmode=disable"
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "payments", "payments.dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer kafka.Close()
	publishPayments(kafka.ListenAddrs())

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "example_run_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) }()
	ledger := schema + ".ledger"

	book := sink.HandlerFunc("ledger", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
		// pgtype.UUID, not uuid.UUID: arrays of it are also sent under the
		// exec and simple_protocol query modes (a transaction pooler).
		ids := make([]pgtype.UUID, len(events))
		payments := make([]string, len(events))
		for i, e := range events {
			var p struct {
				Account string `json:"account"`
			}
			if err := json.Unmarshal(e.Value, &p); err != nil || p.Account == "" {
				return &sink.RejectError{EventID: e.ID, Reason: "not a payment"}
			}
			ids[i], payments[i] = pgtype.UUID{Bytes: e.ID, Valid: true}, string(e.Value)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (event_id, payment)
			SELECT * FROM unnest($1::uuid[], $2::jsonb[])`, ids, payments)
		return err
	})
	done := make(chan error, 1)
	go func() {
		done <- pipeline.Run(ctx, pipeline.Config{
			Brokers:         kafka.ListenAddrs(),
			Topics:          []string{"payments"},
			Group:           "ledger",
			DeadLetterTopic: "payments.dlq",
			Pool:            pool,
			Schema:          schema, // onceflow's tables, and the ledger
			Handlers:        []sink.Handler{book},
			Migrate: func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
				_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.ledger (event_id uuid NOT NULL, payment jsonb NOT NULL)`)
				return err
			},
		})
	}()

	// The last record's dead letter is committed after every payment
	// before it (one partition, read in order): then the ledger is whole.
	deadLetters := 0
	for deadline := time.Now().Add(time.Minute); deadLetters == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.dead_letters`).Scan(&deadLetters)
	}
	stop() // as SIGTERM would: in-flight batches finish, the member leaves the group
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	rows, err := pool.Query(context.Background(), `SELECT payment->>'account', (payment->>'cents')::int, count(*)
		FROM `+ledger+` GROUP BY 1, 2 ORDER BY 1`)
	if err != nil {
		log.Fatal(err)
	}
	for rows.Next() {
		var account string
		var cents, times int
		if err := rows.Scan(&account, &cents, &times); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %d cents, booked %d time(s)\n", account, cents, times)
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead letters:", deadLetters)
	// Output:
	// acct-1: 1250 cents, booked 1 time(s)
	// acct-2: 990 cents, booked 1 time(s)
	// acct-3: 4000 cents, booked 1 time(s)
	// dead letters: 1
}

// publishPayments publishes ExampleRun's records to the payments topic,
// as a producer would: each with its event id (wire.NewRecord).
func publishPayments(brokers []string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	second := uuid.New()
	var recs []*kgo.Record
	for _, r := range []struct {
		id    uuid.UUID
		value string
	}{
		{uuid.New(), `{"account":"acct-1","cents":1250}`},
		{second, `{"account":"acct-2","cents":990}`},
		{second, `{"account":"acct-2","cents":990}`}, // a producer's retry
		{uuid.New(), `{"account":"acct-3","cents":4000}`},
		{uuid.New(), `{"note":"not a payment"}`},
	} {
		recs = append(recs, wire.NewRecord("payments", r.id, []byte(r.value)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
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
