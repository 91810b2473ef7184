package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/api/apitest"
	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// syncBuffer is a log sink the server writes to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

type seedServer struct {
	t      *testing.T
	base   string
	logs   *syncBuffer
	pool   *pgxpool.Pool
	schema string
	stop   func() // stops the server and flushes its spans; idempotent
}

// startSeedServer starts serve with an embedded Kafka in a fresh schema,
// with the default config edited by each of edits (given the schema).
func startSeedServer(t *testing.T, edits ...func(c *config.Config, schema string)) *seedServer {
	return startSeedServerOn(t, nil, edits...)
}

// startSeedServerOn is startSeedServer on brokers, an embedded Kafka when
// nil.
func startSeedServerOn(t *testing.T, brokers []string, edits ...func(c *config.Config, schema string)) *seedServer {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_serve_")
	cfg, err := config.Load("", nil, nil, config.Default{Key: "handlers", Value: registry.names})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Postgres.DSN, cfg.Postgres.Schema, cfg.HTTP.Addr = dsn, schema, "127.0.0.1:0"
	cfg.Batch.Linger = 10 * time.Millisecond
	if brokers != nil {
		cfg.Kafka.Brokers = brokers
	}
	for _, edit := range edits {
		edit(&cfg, schema)
	}
	logs := &syncBuffer{}
	a := &app{cfg: cfg, log: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := a.startServe(ctx, serveOptions{embeddedKafka: brokers == nil, partitions: 3})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := s.wait(); err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	waitMigrated(t, s)
	return &seedServer{t: t, base: "http://" + s.addr, logs: logs, pool: pool, schema: schema, stop: stop}
}

// waitMigrated waits until s's tables exist and its API takes requests,
// failing after 30s.
func waitMigrated(t *testing.T, s *server) {
	t.Helper()
	select {
	case <-s.migrated:
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not reach Postgres and migrate within 30s")
	}
}

func (s *seedServer) do(method, path string, headers map[string]string, body string) (int, http.Header, map[string]any) {
	s.t.Helper()
	return apitest.Client{T: s.t, Base: s.base}.Do(method, path, headers, body)
}

func (s *seedServer) post(key, body string) (int, http.Header, map[string]any) {
	s.t.Helper()
	return apitest.Client{T: s.t, Base: s.base}.Post(key, body)
}

// audit polls GET /audit/event/{id} until cond holds, failing after 30s.
func (s *seedServer) audit(id string, cond func(map[string]any) bool) map[string]any {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, a := s.do("GET", "/audit/event/"+id, nil, "")
		if cond(a) {
			return a
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("audit of %s never satisfied the condition; last: %v", id, a)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// drained waits until the consumer has committed every record the outbox
// and the replays published.
func (s *seedServer) drained() {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pub := sinktest.Count(s.t, s.pool, `SELECT coalesce(sum(publishes), 0)::bigint FROM `+s.schema+`.outbox`)
		done := sinktest.Count(s.t, s.pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+s.schema+`.sink_offsets`)
		if done >= pub {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("consumer committed %d of %d published records", done, pub)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func processed(a map[string]any) []any { p, _ := a["processed"].([]any); return p }

func handlersOf(a map[string]any) []string {
	var hs []string
	for _, p := range processed(a) {
		row := p.(map[string]any)
		hs = append(hs, row["handler"].(string))
	}
	return hs
}

func (s *seedServer) skips(id string) []string {
	var hs []string
	for _, line := range strings.Split(s.logs.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != "dedup.skip" || rec["event_id"] != id {
			continue
		}
		if rec["step"] != "dedup.skip" || rec["bus"] != "kafka" {
			s.t.Errorf("dedup.skip line lacks step/bus: %v", rec)
		}
		hs = append(hs, rec["handler"].(string))
	}
	return hs
}

const order = `{"user_id":1,"items":["A"]}`

// seedHandlers are the seed's four handlers, in the order they run.
var seedHandlers = orders.Names

// The seed's walkthroughs 5.1 (first processing), 5.2 (a replay is
// deduplicated) and 5.3 (one Idempotency-Key twice), end to end: HTTP, the
// outbox, the relay, Kafka and the processor in one serve. (The API's own
// answers are tested in package api.)
func TestSeedWalkthroughs(t *testing.T) {
	s := startSeedServer(t)

	// 5.1: one event, four processed rows, one email.
	id := "7f8a0000-0000-0000-0000-000000000001"
	code, _, body := s.post(id, order)
	if code != 200 || body["event_id"] != id || body["status"] != "accepted" {
		t.Fatalf("5.1 POST: %d %v", code, body)
	}
	a := s.audit(id, func(a map[string]any) bool { return len(processed(a)) == 4 })
	if got := strings.Join(handlersOf(a), ","); got != strings.Join(seedHandlers, ",") {
		t.Errorf("5.1 processed handlers = %s, want %v", got, seedHandlers)
	}
	for _, p := range processed(a) {
		if p.(map[string]any)["bus"] != "kafka" {
			t.Errorf("5.1 processed row %v: bus is not kafka", p)
		}
	}
	if a["emails_sent"] != float64(1) {
		t.Errorf("5.1 emails_sent = %v, want 1", a["emails_sent"])
	}

	// 5.2: replay the same event: still four rows, one email, and
	// dedup.skip logged for each handler.
	code, _, body = s.do("POST", "/demo/replay-event/"+id, nil, "")
	if code != 200 || body["status"] != "replayed" || body["event_id"] != id || body["note"] == "" {
		t.Fatalf("5.2 replay: %d %v", code, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(s.skips(id)) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := s.skips(id); strings.Join(got, ",") != strings.Join(seedHandlers, ",") {
		t.Errorf("5.2 dedup.skip logged for %v, want each of %v once", got, seedHandlers)
	}
	a = s.audit(id, func(map[string]any) bool { return true })
	if len(processed(a)) != 4 || a["emails_sent"] != float64(1) {
		t.Errorf("5.2 after replay: %d processed rows, %v emails; want 4 and 1", len(processed(a)), a["emails_sent"])
	}

	// 5.3: the same Idempotency-Key twice: both 200 with the same answer,
	// one outbox row, four processed rows.
	key := "7f8a0000-0000-0000-0000-000000000002"
	c1, _, b1 := s.post(key, order)
	c2, _, b2 := s.post(key, order)
	if c1 != 200 || c2 != 200 || b1["order_id"] != b2["order_id"] || b1["event_id"] != b2["event_id"] {
		t.Fatalf("5.3 answers: %d %v, then %d %v; want two identical 200s", c1, b1, c2, b2)
	}
	a = s.audit(key, func(a map[string]any) bool { return len(processed(a)) == 4 })
	if ob := a["outbox"].(map[string]any); ob["count"] != float64(1) {
		t.Errorf("5.3 outbox.count = %v, want 1", ob["count"])
	}
	s.drained()
	if a = s.audit(key, func(map[string]any) bool { return true }); len(processed(a)) != 4 || a["emails_sent"] != float64(1) {
		t.Errorf("5.3: %d processed rows, %v emails; want 4 and 1", len(processed(a)), a["emails_sent"])
	}
}

// serve's own API writes orders whatever the handlers: with no Go handler
// and only sql_handlers, an order is accepted (its table exists, though
// none of the demo handlers' tables do) and the SQL handler applies it.
func TestServeWithOnlySQLHandlersTakesOrders(t *testing.T) {
	s := startSeedServer(t, func(c *config.Config, schema string) {
		c.Handlers = []string{}
		c.SQLHandlers = []config.SQLHandler{{Name: "orderUsers",
			SQL: `INSERT INTO ` + schema + `.order_users (event_id, user_id) SELECT event_id, (payload->>'user_id')::bigint FROM events`}}
		for _, q := range []string{`CREATE SCHEMA ` + schema, `CREATE TABLE ` + schema + `.order_users (event_id uuid, user_id bigint)`} {
			if _, err := sinktest.Pool(t).Exec(t.Context(), q); err != nil {
				t.Fatal(err)
			}
		}
	})
	id := "7f8a0000-0000-0000-0000-0000000000b1"
	code, _, body := s.post(id, order)
	if code != 200 || body["event_id"] != id || body["status"] != "accepted" {
		t.Fatalf("POST: %d %v, want 200 accepted", code, body)
	}
	a := s.audit(id, func(a map[string]any) bool { return len(processed(a)) == 1 })
	if got := handlersOf(a); len(got) != 1 || got[0] != "orderUsers" || a["emails_sent"] != nil {
		t.Errorf("processed by %v, emails_sent %v; want orderUsers alone and no emails_sent", got, a["emails_sent"])
	}
	if n := sinktest.Count(t, s.pool, `SELECT count(*) FROM `+s.schema+`.order_users WHERE event_id = $1 AND user_id = 1`, id); n != 1 {
		t.Errorf("order_users has %d rows for the order, want 1", n)
	}
	if n := sinktest.Count(t, s.pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'emails_sent'`, s.schema); n != 0 {
		t.Errorf("emails_sent exists without the demo's handlers")
	}
}

// serve's relay creates the outbox's topic on first use, as onceflow
// produce does, where the brokers create topics on request; the order is
// then published and applied once. Deleted while serve runs, the topic is
// created again and the next order published (the relay's client learns
// the new topic id).
func TestServeCreatesItsTopic(t *testing.T) {
	seeds, ok := testBrokers(t)["kafka"]
	if !ok {
		t.Skip(envKafka + " is not set: this needs a broker that creates topics on request")
	}
	brokers := seeds(t)
	topic := "serve-created-" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})
	s := startSeedServerOn(t, brokers, func(c *config.Config, _ string) {
		c.Kafka.Topics, c.Kafka.Group = []string{topic}, topic
	})
	id := "7f8a0000-0000-0000-0000-0000000000b2"
	if code, _, body := s.post(id, order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	a := s.audit(id, func(a map[string]any) bool {
		ob, _ := a["outbox"].(map[string]any)
		return ob != nil && ob["publishes"] == float64(1) && len(processed(a)) == len(orders.Names)
	})
	if a["emails_sent"] != float64(1) {
		t.Errorf("emails_sent %v, want one row", a["emails_sent"])
	}

	if _, err := adm.DeleteTopics(t.Context(), topic); err != nil {
		t.Fatal(err)
	}
	again := "7f8a0000-0000-0000-0000-0000000000b3"
	if code, _, body := s.post(again, order); code != 200 {
		t.Fatalf("POST after the topic was deleted: %d %v", code, body)
	}
	deadline := time.Now().Add(60 * time.Second)
	for sinktest.Count(t, s.pool, `SELECT count(*) FROM `+s.schema+`.outbox WHERE event_id = $1 AND publishes = 1`, again) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the order posted after the topic was deleted is unpublished after 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
