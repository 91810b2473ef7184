// Command customhandler embeds onceflow in a program of its own: a Go
// handler that books payments into a ledger, run by package pipeline
// against an embedded Kafka (franz-go's kfake) and a Postgres database.
//
// It publishes payments with redeliveries among them, and one payment
// its handler rejects, and consumes them with one member of a consumer
// group; it publishes some payments again while that member runs, stops
// it (draining, as on SIGTERM), publishes a replay of some payments, and
// consumes them with a new member, as after a restart. Then it prints what the tables hold: every
// payment booked exactly once, the rejected one as a dead letter. The
// ledger has no unique key and the balances add up, so a payment applied
// twice would show.
//
//	go run ./examples/customhandler -dsn postgres://onceflow:onceflow@127.0.0.1:5432/onceflow
//
// It drops and recreates the Postgres schema -schema (onceflow_example by
// default) at start. It exits 1 unless every effect happened exactly once.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

const (
	topic           = "payments"
	deadLetterTopic = "payments.dlq"
	group           = "ledger"
)

type options struct {
	dsn      string
	schema   string
	payments int
	seed     uint64
	timeout  time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", defaultDSN(), "Postgres connection string (default: $ONCEFLOW_TEST_POSTGRES_DSN, else the local database of infra/postgres.sh)")
	flag.StringVar(&o.schema, "schema", "onceflow_example", "Postgres schema this program drops, recreates and writes to")
	flag.IntVar(&o.payments, "payments", 1000, "unique payments to publish")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the generated payments")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up if consuming has not finished by then")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "customhandler:", err)
		os.Exit(1)
	}
}

func defaultDSN() string {
	if dsn := os.Getenv("ONCEFLOW_TEST_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow?sslmode=disable"
}

// payment is the event: the record's JSON value.
type payment struct {
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
}

// ledger is the program's handler. It books the payments it is given —
// only those this handler newly claimed, in this batch's transaction — in
// two set-based statements: a ledger row each (no unique key: a payment
// booked twice would be two rows) and the accounts' balances (counters
// that add). A payment that can never apply is rejected: it becomes a dead
// letter and the rest of the batch applies.
func ledger(schema string) sink.Handler {
	ledgerTable := pgx.Identifier{schema, "ledger"}.Sanitize()
	balances := pgx.Identifier{schema, "balances"}.Sanitize()
	return sink.HandlerFunc("ledger", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
		// pgtype.UUID, not uuid.UUID: a DSN behind a transaction pooler
		// sets the exec or simple_protocol query mode, where parameters
		// are sent as text and an array of uuid.UUID has no text encoding.
		ids := make([]pgtype.UUID, len(events))
		accounts := make([]string, len(events))
		cents := make([]int64, len(events))
		for i, e := range events {
			var p payment
			if err := json.Unmarshal(e.Value, &p); err != nil || p.Account == "" || p.Cents <= 0 {
				return &sink.RejectError{EventID: e.ID, Reason: "not a payment: an account and positive cents are required"}
			}
			ids[i], accounts[i], cents[i] = pgtype.UUID{Bytes: e.ID, Valid: true}, p.Account, p.Cents
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledgerTable+` (event_id, account, cents)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[])`, ids, accounts, cents); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+balances+` AS b (account, cents)
			SELECT account, sum(cents) FROM unnest($1::text[], $2::bigint[]) AS p(account, cents) GROUP BY account
			ON CONFLICT (account) DO UPDATE SET cents = b.cents + excluded.cents`, accounts, cents)
		return err
	})
}

// migrateLedger creates the handler's tables; pipeline.Run calls it at
// every start, after onceflow's own tables.
func migrateLedger(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE IF NOT EXISTS %s (event_id uuid NOT NULL, account text NOT NULL, cents bigint NOT NULL);
		CREATE TABLE IF NOT EXISTS %s (account text PRIMARY KEY, cents bigint NOT NULL)`,
		pgx.Identifier{schema, "ledger"}.Sanitize(), pgx.Identifier{schema, "balances"}.Sanitize()))
	return err
}

func run(ctx context.Context, o options, out io.Writer) error {
	if o.payments < 1 {
		return fmt.Errorf("-payments %d: at least 1", o.payments)
	}
	pool, err := pgxpool.New(ctx, o.dsn)
	if err != nil {
		return errors.New("-dsn: not a valid connection string")
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{o.schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("reset schema %s: %w", o.schema, err)
	}

	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.SeedTopics(1, deadLetterTopic))
	if err != nil {
		return fmt.Errorf("embedded kafka: %w", err)
	}
	defer kafka.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		return err
	}
	defer producer.Close()

	w := newWorkload(o.payments, o.seed)
	if err := producer.ProduceSync(ctx, w.records...).FirstErr(); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	fmt.Fprintf(out, "published %d payments and 1 bad one as %d records (%d redelivered at once) on the embedded Kafka\n",
		o.payments, len(w.records), len(w.records)-o.payments-1)

	cfg := pipeline.Config{
		Brokers: kafka.ListenAddrs(), Topics: []string{topic}, Group: group, DeadLetterTopic: deadLetterTopic,
		Pool: pool, Schema: o.schema,
		Handlers: []sink.Handler{ledger(o.schema)}, Migrate: migrateLedger,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	m, err := start(ctx, cfg)
	if err != nil {
		return err
	}
	if err := m.await(ctx, len(w.records), o.timeout); err != nil {
		return errors.Join(err, m.leave())
	}
	// Redeliveries while the member runs: its LRU knows these payments.
	if err := producer.ProduceSync(ctx, w.late...).FirstErr(); err != nil {
		return errors.Join(fmt.Errorf("publish: %w", err), m.leave())
	}
	fmt.Fprintf(out, "published %d payments again while member 1 runs\n", len(w.late))
	if err := m.await(ctx, len(w.records)+len(w.late), o.timeout); err != nil {
		return errors.Join(err, m.leave())
	}
	if err := m.leave(); err != nil {
		return err
	}
	fmt.Fprintf(out, "member 1 stopped (drained): %s\n", describe(m.r.Stats()))

	// A replay after a restart: the new member's LRU is empty, so Postgres
	// (processed_events) recognizes the payments.
	replay := w.replay(o.payments / 10)
	if err := producer.ProduceSync(ctx, replay...).FirstErr(); err != nil {
		return fmt.Errorf("publish the replay: %w", err)
	}
	fmt.Fprintf(out, "published a replay of %d payments, then started member 2\n", len(replay))
	m, err = start(ctx, cfg)
	if err != nil {
		return err
	}
	if err := m.await(ctx, len(replay), o.timeout); err != nil {
		return errors.Join(err, m.leave())
	}
	if err := m.leave(); err != nil {
		return err
	}
	fmt.Fprintf(out, "member 2 stopped (drained): %s\n", describe(m.r.Stats()))

	return w.check(ctx, pool, o.schema, out)
}

// member is a running pipeline: one member of the consumer group.
type member struct {
	r    *pipeline.Runner
	stop context.CancelFunc
	done chan error // Run's result
}

// start runs a pipeline member in a goroutine; its owner calls leave.
func start(ctx context.Context, cfg pipeline.Config) (*member, error) {
	r, err := pipeline.New(cfg)
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(ctx)
	m := &member{r: r, stop: stop, done: make(chan error, 1)}
	go func() { m.done <- r.Run(rctx) }()
	return m, nil
}

// await returns once the member has applied, skipped or dead-lettered
// records records in all (each record counts once: the handler is alone).
func (m *member) await(ctx context.Context, records int, timeout time.Duration) error {
	deadline := time.After(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		n := handled(m.r.Stats())
		if n >= int64(records) {
			return nil
		}
		select {
		case err := <-m.done:
			m.done <- err // for leave
			return fmt.Errorf("the pipeline stopped early: %v", err)
		case <-deadline:
			return fmt.Errorf("handled %d of %d records in %v", n, records, timeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// leave stops the member as SIGTERM would — in-flight batches finish,
// offsets are committed, it leaves the group — and waits for it.
func (m *member) leave() error {
	m.stop()
	return <-m.done
}

func handled(s processor.Stats) int64 {
	return s.Applied + s.SkippedLRU + s.SkippedPostgres + s.DeadLetters
}

func describe(s processor.Stats) string {
	return fmt.Sprintf("%d records: %d booked, %d skipped as already booked (%d by the LRU, %d by Postgres), dead letters: %d",
		handled(s), s.Applied, s.SkippedLRU+s.SkippedPostgres, s.SkippedLRU, s.SkippedPostgres, s.DeadLetters)
}

// workload is the published payments, and what the tables must hold.
type workload struct {
	records []*kgo.Record // published first
	late    []*kgo.Record // published again while the first member runs
	unique  []*kgo.Record // one record per valid payment
	bad     uuid.UUID     // the payment the handler rejects
	balance map[string]int64
	rng     *rand.Rand
}

// newWorkload makes n payments to 20 accounts, a third of them redelivered
// (half right after the original, half later), and one bad payment.
func newWorkload(n int, seed uint64) *workload {
	w := &workload{bad: uuid.New(), balance: map[string]int64{}, rng: rand.New(rand.NewPCG(seed, 0))}
	for i := range n {
		p := payment{Account: fmt.Sprintf("acct-%02d", w.rng.IntN(20)), Cents: 1 + w.rng.Int64N(10000)}
		v, _ := json.Marshal(p)
		rec := wire.NewRecord(topic, uuid.New(), v)
		w.unique = append(w.unique, rec)
		w.balance[p.Account] += p.Cents
		w.records = append(w.records, rec)
		switch i % 6 {
		case 0:
			w.records = append(w.records, copyRecord(rec))
		case 3:
			w.late = append(w.late, copyRecord(rec))
		}
		if i == n/2 {
			w.records = append(w.records, wire.NewRecord(topic, w.bad, []byte(`{"account":"acct-00","cents":-500}`)))
		}
	}
	w.rng.Shuffle(len(w.late), func(i, j int) { w.late[i], w.late[j] = w.late[j], w.late[i] })
	return w
}

// replay returns copies of n payments already published.
func (w *workload) replay(n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = copyRecord(w.unique[w.rng.IntN(len(w.unique))])
	}
	return recs
}

func copyRecord(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

// check compares the tables with the payments published and prints the
// verdict.
func (w *workload) check(ctx context.Context, pool *pgxpool.Pool, schema string, out io.Writer) error {
	var rows, distinct, dead int64
	q := fmt.Sprintf(`SELECT count(*), count(DISTINCT event_id) FROM %s`, pgx.Identifier{schema, "ledger"}.Sanitize())
	if err := pool.QueryRow(ctx, q).Scan(&rows, &distinct); err != nil {
		return fmt.Errorf("read the ledger: %w", err)
	}
	q = fmt.Sprintf(`SELECT count(*) FROM %s WHERE event_id = $1`, pgx.Identifier{schema, "dead_letters"}.Sanitize())
	if err := pool.QueryRow(ctx, q, w.bad).Scan(&dead); err != nil {
		return fmt.Errorf("read the dead letters: %w", err)
	}
	balances := map[string]int64{}
	q = fmt.Sprintf(`SELECT account, cents FROM %s`, pgx.Identifier{schema, "balances"}.Sanitize())
	brows, err := pool.Query(ctx, q)
	if err != nil {
		return fmt.Errorf("read the balances: %w", err)
	}
	var account string
	var cents int64
	if _, err := pgx.ForEachRow(brows, []any{&account, &cents}, func() error { balances[account] = cents; return nil }); err != nil {
		return fmt.Errorf("read the balances: %w", err)
	}
	var wrong []string
	for acct, want := range w.balance {
		if balances[acct] != want {
			wrong = append(wrong, fmt.Sprintf("%s holds %d cents, want %d", acct, balances[acct], want))
		}
	}
	fmt.Fprintf(out, "ledger: %d rows for %d distinct payments (want %d); balances of %d accounts match the payments: %v; "+
		"the bad payment is a dead letter: %v\n", rows, distinct, len(w.unique), len(w.balance), len(wrong) == 0, dead > 0)
	if rows != int64(len(w.unique)) || distinct != rows || len(wrong) > 0 || dead == 0 {
		fmt.Fprintln(out, "exactly once: NO")
		return fmt.Errorf("effects are not exactly once: %d ledger rows for %d payments; %v", rows, len(w.unique), wrong)
	}
	fmt.Fprintln(out, "exactly once: yes")
	return nil
}
