package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noop(context.Context, pgx.Tx, []sink.Event) error { return nil }

// New reports every problem with a Config at once, each naming its field,
// and never echoes the DSN.
func TestNewReportsEveryProblem(t *testing.T) {
	h := sink.HandlerFunc("h", noop)
	ok := pipeline.Config{Brokers: []string{"127.0.0.1:9092"}, Topics: []string{"t"}, Group: "g",
		DSN: "postgres://u:pw@127.0.0.1:5432/db", Handlers: []sink.Handler{h}}
	with := func(f func(*pipeline.Config)) pipeline.Config { c := ok; f(&c); return c }
	for _, tc := range []struct {
		name string
		cfg  pipeline.Config
		want []string
	}{
		{"empty", pipeline.Config{}, []string{"no Brokers", "no Topics", "no consumer Group", "set Pool or DSN",
			"at least one handler"}},
		{"both pool and dsn", with(func(c *pipeline.Config) { c.Pool = &pgxpool.Pool{} }), []string{"both Pool and DSN"}},
		{"bad dsn", with(func(c *pipeline.Config) { c.DSN = "postgres://u:hunter2@127.0.0.1:notaport/db" }),
			[]string{"DSN is not a valid connection string"}},
		{"fields set twice", with(func(c *pipeline.Config) {
			c.Consumer = processor.Config{Brokers: []string{"x:1"}, Group: "g2"}
			c.Writer = sink.Config{Handlers: []sink.Handler{h}}
		}), []string{"Consumer.Brokers is set: set Config.Brokers", "Consumer.Group is set", "Writer.Handlers is set"}},
		{"tuning out of range", with(func(c *pipeline.Config) {
			c.Consumer.BatchMaxRecords = -1
			c.Consumer.DrainTimeout = time.Hour
			c.PoolSize = -2
		}), []string{"BatchMaxRecords -1", "DrainTimeout 1h0m0s must be shorter", "PoolSize -2"}},
		{"handlers", with(func(c *pipeline.Config) { c.Handlers = []sink.Handler{h, sink.HandlerFunc("", noop), h} }),
			[]string{"empty name", `handler "h" registered twice`}},
		{"dead-letter topic consumed", with(func(c *pipeline.Config) { c.DeadLetterTopic = "t" }),
			[]string{`DeadLetterTopic "t" is also a consumed topic`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := pipeline.New(tc.cfg)
			if err == nil {
				t.Fatalf("New returned a Runner (%v), want an error naming %q", r, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the password:\n%v", err)
			}
			if n := strings.Count(err.Error(), "Group"); tc.name == "empty" && n != 1 {
				t.Errorf("a missing Group is reported %d times, want once:\n%v", n, err)
			}
		})
	}
	if _, err := pipeline.New(ok); err != nil {
		t.Errorf("New(a valid config): %v", err)
	}
}

// Run, from a DSN, creates onceflow's tables and the handler's, applies
// every event once however often it is delivered, dead-letters an event
// its handler rejects (a copy reaches the dead-letter topic) and returns
// nil once its context ends.
func TestRunAppliesEachEventOnce(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	table := pgx.Identifier{schema, "payments"}.Sanitize()

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "payments"), kfake.SeedTopics(1, "payments.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const unique = 300
	var recs []*kgo.Record
	bad := uuid.New()
	for i := range unique {
		id := uuid.New()
		value := fmt.Appendf(nil, `{"cents":%d}`, i+1)
		if i == 7 {
			id, value = bad, []byte(`{"cents":-5}`)
		}
		for range 1 + i%3 { // redeliveries: 0, 1 or 2 more copies
			recs = append(recs, wire.NewRecord("payments", id, value))
		}
	}
	produce(t, c, recs...)

	book := sink.HandlerFunc("book", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
		ids, cents := make([]uuid.UUID, len(events)), make([]string, len(events))
		for i, e := range events {
			if e.ID == bad {
				return &sink.RejectError{EventID: e.ID, Reason: "negative amount"}
			}
			ids[i], cents[i] = e.ID, string(e.Value)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, cents)
			SELECT id, (v::jsonb->>'cents')::bigint FROM unnest($1::uuid[], $2::text[]) AS u(id, v)`, ids, cents)
		return err
	})
	r, err := pipeline.New(pipeline.Config{
		Brokers: c.ListenAddrs(), Topics: []string{"payments"}, Group: "pipeline-test", DeadLetterTopic: "payments.dlq",
		DSN: dsn, Schema: schema, Handlers: []sink.Handler{book},
		Migrate: func(ctx context.Context, pool *pgxpool.Pool, _ string) error {
			_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (event_id uuid NOT NULL, cents bigint NOT NULL)`)
			return err
		},
		Consumer: processor.Config{KafkaOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(); !errors.Is(err, pipeline.ErrNotConsuming) {
		t.Errorf("Ready before Run = %v, want ErrNotConsuming", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	waitFor(t, done, "every record committed", func() bool {
		return sinktest.Count(t, pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+pgx.Identifier{schema, "sink_offsets"}.Sanitize()) == int64(len(recs))
	})
	if err := r.Ready(); err != nil {
		t.Errorf("Ready while consuming: %v", err)
	}
	waitFor(t, done, "the dead letter's copy published", func() bool { return r.Stats().DeadLettersPublished >= 1 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its context's end")
	}

	if got := sinktest.Count(t, pool, `SELECT count(*) FROM `+table); got != unique-1 {
		t.Errorf("%d payments booked, want %d (each unique event once, the rejected one never)", got, unique-1)
	}
	if got := sinktest.Count(t, pool, `SELECT count(DISTINCT event_id) FROM `+table); got != unique-1 {
		t.Errorf("%d distinct events booked, want %d", got, unique-1)
	}
	dead := sinktest.Count(t, pool, `SELECT count(*) FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+` WHERE event_id = $1`, bad)
	if dead < 1 {
		t.Errorf("the rejected event has no dead letter")
	}
	if err := r.Run(t.Context()); err == nil {
		t.Error("a second Run returned nil, want an error")
	}
}

// An error waiting cannot cure — an unknown database, a refused password —
// ends Run at once, naming the step, without the password.
func TestRunFailsOnPostgresConfiguration(t *testing.T) {
	u, err := url.Parse(sinktest.DSN(t))
	if err != nil {
		t.Skipf("test DSN is not a URL: %v", err)
	}
	u.Path = "/onceflow_no_such_database"
	u.User = url.UserPassword(u.User.Username(), "n0t-the-passw0rd")
	r, err := pipeline.New(pipeline.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, Group: "g",
		DSN: u.String(), Handlers: []sink.Handler{sink.HandlerFunc("h", noop)}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context()) }()
	select {
	case err := <-done:
		switch {
		case err == nil:
			t.Fatal("Run returned nil, want an error")
		case !strings.Contains(err.Error(), "connect: postgres at"):
			t.Errorf("error does not name the step and the server: %v", err)
		case strings.Contains(err.Error(), "n0t-the-passw0rd"):
			t.Errorf("error shows the password: %v", err)
		}
	case <-time.After(30 * time.Second):
		r.Abort()
		<-done
		t.Fatal("Run waited on a configuration error instead of returning it")
	}
}

// While Postgres does not answer, Run waits, Ready says so, and Abort (or
// the context's end) makes Run return nil.
func TestRunWaitsForPostgresUntilAbort(t *testing.T) {
	for _, stop := range []string{"abort", "kill", "cancel"} {
		t.Run(stop, func(t *testing.T) {
			r, err := pipeline.New(pipeline.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, Group: "g",
				DSN: "postgres://u@127.0.0.1:1/db?connect_timeout=1", Handlers: []sink.Handler{sink.HandlerFunc("h", noop)}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			if err := r.Ready(); !errors.Is(err, pipeline.ErrNotConsuming) {
				t.Errorf("Ready while waiting = %v, want ErrNotConsuming", err)
			}
			select {
			case err := <-done:
				t.Fatalf("Run returned %v while Postgres is down, want it to wait", err)
			case <-time.After(300 * time.Millisecond):
			}
			if r.Partitions() != nil {
				t.Errorf("Partitions while waiting = %v, want none", r.Partitions())
			}
			switch stop {
			case "abort":
				r.Abort()
			case "kill":
				r.Kill()
			default:
				cancel()
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run after %s: %v, want nil", stop, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("Run did not return after %s", stop)
			}
		})
	}
}

func produce(t *testing.T, c *kfake.Cluster, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond for up to 60s, failing if Run returns first.
func waitFor(t *testing.T, done <-chan error, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		select {
		case err := <-done:
			t.Fatalf("Run returned before %s: %v", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 60s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// With Retention set, Run keeps the dedup state to the horizon while it
// consumes — slices started and dropped — warns about a topic that keeps
// records longer, and stops its maintenance with the consumer.
func TestRunRetention(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	adm := kadm.NewClient(mustClient(t, c))
	if _, err := adm.AlterTopicConfigs(t.Context(), []kadm.AlterConfig{{Name: "retention.ms", Value: kadm.StringPtr("86400000")}}, "events"); err != nil {
		t.Fatal(err)
	}
	produce(t, c, wire.NewRecord("events", uuid.New(), []byte(`{}`)))

	var logs syncBuffer
	r, err := pipeline.New(pipeline.Config{
		Brokers: c.ListenAddrs(), Topics: []string{"events"}, Group: "retention-test",
		DSN: dsn, Schema: schema, Handlers: []sink.Handler{sink.HandlerFunc("h", noop)},
		Retention: time.Second, RetentionSlices: 2,
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		Consumer: processor.Config{KafkaOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	slices := pgx.Identifier{schema, "processed_events_slices"}.Sanitize()
	waitFor(t, done, "slice 0 dropped past the horizon", func() bool {
		return sinktest.Count(t, pool, `SELECT min(slice) FROM `+slices) > 0
	})
	waitFor(t, done, "the topic's retention warned about", func() bool {
		return strings.Contains(logs.String(), "the topic keeps records for 24h0m0s, longer than the dedup horizon")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Nothing rotates once Run has returned.
	n := sinktest.Count(t, pool, `SELECT max(slice) FROM `+slices)
	time.Sleep(1500 * time.Millisecond)
	if m := sinktest.Count(t, pool, `SELECT max(slice) FROM `+slices); m != n {
		t.Errorf("slices went on rotating after Run returned: %d, then %d", n, m)
	}
}

func mustClient(t *testing.T, c *kfake.Cluster) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
