package api_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/api"
	"github.com/onceflow/onceflow/internal/api/apitest"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// published is a Publisher that records what the replay endpoint sends,
// or fails with err.
type published struct {
	mu   sync.Mutex
	recs []string // topic/id/payload
	err  error
}

func (p *published) Publish(_ context.Context, topic string, id uuid.UUID, payload []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	p.recs = append(p.recs, topic+"/"+id.String()+"/"+string(payload))
	return nil
}

type seed struct {
	t      *testing.T
	url    string
	pool   *pgxpool.Pool
	schema string
	pub    *published
}

func newSeed(t *testing.T) *seed {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, outbox.Migrate, orders.Migrate)
	store, err := outbox.NewStore(pool, outbox.StoreConfig{Schema: schema, Topic: "orders", SamePayload: orders.Same})
	if err != nil {
		t.Fatal(err)
	}
	pub := &published{}
	s, err := api.NewSeed(api.SeedConfig{Pool: pool, Store: store, Publisher: pub, Schema: schema, Bus: "kafka",
		Topic: "orders", Handlers: orders.Names})
	if err != nil {
		t.Fatal(err)
	}
	mux := api.NewMux(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "onceflow_up 1\n")
	}), api.PostgresCheck(pool))
	s.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &seed{t: t, url: srv.URL, pool: pool, schema: schema, pub: pub}
}

func (s *seed) do(method, path string, headers map[string]string, body string) (int, http.Header, map[string]any) {
	s.t.Helper()
	return apitest.Client{T: s.t, Base: s.url}.Do(method, path, headers, body)
}

// postKeys posts an order with one Idempotency-Key header per key, and
// returns the status and the body.
func (s *seed) postKeys(keys ...string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest("POST", s.url+"/events-outbox/kafka", strings.NewReader(order))
	if err != nil {
		s.t.Fatal(err)
	}
	for _, k := range keys {
		req.Header.Add("Idempotency-Key", k)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func (s *seed) post(key, body string) (int, http.Header, map[string]any) {
	s.t.Helper()
	return apitest.Client{T: s.t, Base: s.url}.Post(key, body)
}

func (s *seed) audit(id string) map[string]any {
	s.t.Helper()
	code, _, a := s.do("GET", "/audit/event/"+id, nil, "")
	if code != 200 {
		s.t.Fatalf("audit %s: %d %v", id, code, a)
	}
	return a
}

const order = `{"user_id":1,"items":["A"]}`

// An order is written with its outbox row; the answer names the event and
// the order.
func TestIngestWritesOrderAndOutbox(t *testing.T) {
	s := newSeed(t)
	id := "7f8a0000-0000-0000-0000-000000000001"
	code, _, body := s.post(id, order)
	if code != 200 || body["event_id"] != id || body["status"] != "accepted" || body["order_id"] == float64(0) {
		t.Fatalf("POST: %d %v", code, body)
	}
	if n := sinktest.Count(t, s.pool, `SELECT count(*) FROM `+s.schema+`.orders WHERE event_id = $1 AND user_id = 1`, id); n != 1 {
		t.Errorf("%d order rows, want 1", n)
	}
	ob := s.audit(id)["outbox"].(map[string]any)
	if ob["count"] != float64(1) || ob["published"] != false || ob["failed_at"] != nil {
		t.Errorf("outbox = %v, want one unpublished row", ob)
	}
}

// The seed's 5.3: one Idempotency-Key twice gives two identical answers,
// the second marked replayed, and one row each; a reformatted body is the
// same order, another order is refused with 422.
func TestIdempotencyKeyTwice(t *testing.T) {
	s := newSeed(t)
	key := "7f8a0000-0000-0000-0000-000000000002"
	c1, h1, b1 := s.post(key, order)
	c2, h2, b2 := s.post(key, `{"items": ["A"], "user_id": 1}`)
	if c1 != 200 || c2 != 200 || b1["order_id"] != b2["order_id"] || b1["event_id"] != b2["event_id"] {
		t.Fatalf("answers: %d %v, then %d %v; want two identical 200s", c1, b1, c2, b2)
	}
	if h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" {
		t.Errorf("Idempotent-Replayed: first %q, second %q; want only the second true", h1.Get("Idempotent-Replayed"), h2.Get("Idempotent-Replayed"))
	}
	if code, _, body := s.post(key, `{"user_id":2,"items":["B"]}`); code != 422 {
		t.Errorf("same key, other order: %d %v, want 422", code, body)
	}
	for _, table := range []string{"orders", "outbox"} {
		if n := sinktest.Count(t, s.pool, `SELECT count(*) FROM `+s.schema+`.`+table); n != 1 {
			t.Errorf("%s has %d rows, want 1", table, n)
		}
	}
}

func TestIngestRejectsBadRequests(t *testing.T) {
	s := newSeed(t)
	for _, tc := range []struct {
		name    string
		path    string
		headers map[string]string
		body    string
		code    int
		want    string
	}{
		{"other bus", "/events-outbox/rabbitmq", map[string]string{"Idempotency-Key": "7f8a0000-0000-0000-0000-0000000000a1"}, order, 400, `only "kafka"`},
		{"no key", "/events-outbox/kafka", nil, order, 400, "Idempotency-Key header is required"},
		{"bad key", "/events-outbox/kafka", map[string]string{"Idempotency-Key": "abc"}, order, 400, `"abc" is not a UUID`},
		{"bad body", "/events-outbox/kafka", map[string]string{"Idempotency-Key": "7f8a0000-0000-0000-0000-0000000000a2"}, `{"user_id":1}`, 400, "items is empty"},
		{"not json", "/events-outbox/kafka", map[string]string{"Idempotency-Key": "7f8a0000-0000-0000-0000-0000000000a3"}, `user=1`, 400, "not an order"},
		{"too large", "/events-outbox/kafka", map[string]string{"Idempotency-Key": "7f8a0000-0000-0000-0000-0000000000a6"},
			`{"user_id":1,"items":["` + strings.Repeat("A", 1<<20) + `"]}`, 413, "over 1 MiB"},
		{"unknown replay", "/demo/replay-event/7f8a0000-0000-0000-0000-0000000000a4", nil, "", 404, "no event"},
		{"bad replay id", "/demo/replay-event/xyz", nil, "", 400, "not a UUID"},
		{"bad audit id", "/audit/event/xyz", nil, "", 400, "not a UUID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if strings.HasPrefix(tc.path, "/audit") {
				method = "GET"
			}
			code, _, body := s.do(method, tc.path, tc.headers, tc.body)
			msg, _ := body["error"].(string)
			if code != tc.code || !strings.Contains(msg, tc.want) {
				t.Errorf("got %d %q, want %d with %q", code, msg, tc.code, tc.want)
			}
		})
	}
	// Two different keys: which one the client retries with is unknown.
	if code, raw := s.postKeys("7f8a0000-0000-0000-0000-0000000000a7", "7f8a0000-0000-0000-0000-0000000000a8"); code != 400 ||
		!strings.Contains(raw, "given 2 times with different values") {
		t.Errorf("two Idempotency-Keys: %d %s, want 400 naming them", code, raw)
	}
	// One key twice, in two cases: the same key.
	if code, raw := s.postKeys("7f8a0000-0000-0000-0000-0000000000a9", "7F8A0000-0000-0000-0000-0000000000A9"); code != 200 {
		t.Errorf("one Idempotency-Key twice, in two cases: %d %s, want 200", code, raw)
	}
	if n := sinktest.Count(t, s.pool, `SELECT count(*) FROM `+s.schema+`.outbox WHERE event_id <> '7f8a0000-0000-0000-0000-0000000000a9'`); n != 0 {
		t.Errorf("bad requests left %d outbox rows", n)
	}
}

// The audit lists what the consumer side recorded (processed rows in the
// handlers' order, emails) and the outbox row, a failure included.
func TestAuditShowsEveryStep(t *testing.T) {
	s := newSeed(t)
	id := uuid.MustParse("7f8a0000-0000-0000-0000-000000000003")
	if code, _, body := s.post(id.String(), order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	// The consumer side applies it, as a batch through sink.
	hs, err := orders.Handlers(s.schema)
	if err != nil {
		t.Fatal(err)
	}
	w, err := sink.New(s.pool, sink.Config{Schema: s.schema, Group: "g", Handlers: hs})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := w.Take(t.Context(), "orders", []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: leases[0].Epoch, Fence: -1, NextOffset: 1,
		Events: []sink.Event{{ID: id, Value: []byte(order), Topic: "orders"}}}); err != nil {
		t.Fatal(err)
	}
	a := s.audit(id.String())
	var got []string
	for _, p := range a["processed"].([]any) {
		got = append(got, p.(map[string]any)["handler"].(string))
	}
	if strings.Join(got, ",") != strings.Join(orders.Names, ",") || a["emails_sent"] != float64(1) {
		t.Errorf("audit: processed %v, emails %v; want %v and 1", got, a["emails_sent"], orders.Names)
	}
	// The broker refused it (as the relay marks such a row).
	if _, err := s.pool.Exec(t.Context(), `UPDATE `+s.schema+`.outbox SET failed_at = now(),
fail_reason = 'MESSAGE_TOO_LARGE: too big' WHERE event_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	ob := s.audit(id.String())["outbox"].(map[string]any)
	if ob["failed_at"] == nil || ob["fail_reason"] != "MESSAGE_TOO_LARGE: too big" {
		t.Errorf("audit outbox = %v, want the failure and its reason", ob)
	}
}

// A replay publishes the stored payload with the same id and counts it; a
// publisher that fails is a 502.
func TestReplayPublishesTheSameEvent(t *testing.T) {
	s := newSeed(t)
	id := "7f8a0000-0000-0000-0000-000000000004"
	if code, _, body := s.post(id, order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	code, _, body := s.do("POST", "/demo/replay-event/"+id, nil, "")
	if code != 200 || body["status"] != "replayed" || body["event_id"] != id || body["note"] == "" {
		t.Fatalf("replay: %d %v", code, body)
	}
	if want := "orders/" + id + "/" + order; len(s.pub.recs) != 1 || s.pub.recs[0] != want {
		t.Errorf("published %v, want [%s]", s.pub.recs, want)
	}
	if ob := s.audit(id)["outbox"].(map[string]any); ob["publishes"] != float64(1) {
		t.Errorf("outbox publishes = %v after one replay, want 1", ob["publishes"])
	}
	s.pub.err = errors.New("broker down")
	if code, _, body := s.do("POST", "/demo/replay-event/"+id, nil, ""); code != 502 || !strings.Contains(body["error"].(string), "broker down") {
		t.Errorf("replay with a failing publisher: %d %v, want 502", code, body)
	}
	// An event the broker refuses (one just under ingest's 1 MiB, over the
	// producer's record limit) is no gateway's failure.
	s.pub.err = fmt.Errorf("%w (uncompressed_bytes=1000160)", kerr.MessageTooLarge)
	if code, _, body := s.do("POST", "/demo/replay-event/"+id, nil, ""); code != 422 || !strings.Contains(body["error"].(string), "kafka refuses the event") {
		t.Errorf("replay of an event the broker refuses: %d %v, want 422", code, body)
	}
}

func TestHealthReadinessMetrics(t *testing.T) {
	s := newSeed(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _, body := s.do("GET", path, nil, ""); code != 200 {
			t.Errorf("%s: %d %v", path, code, body)
		}
	}
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(raw), "onceflow_up 1") {
		t.Errorf("/metrics: %d %q", resp.StatusCode, raw)
	}

	// Postgres that does not answer: not ready.
	dead, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	rec := httptest.NewRecorder()
	kafka := api.Check{Name: "kafka", Ready: func(context.Context) error { return errors.New("brokers [b:9092] do not answer") }}
	api.NewMux(nil, api.PostgresCheck(dead), kafka).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), `"postgres":"postgres does not answer`) ||
		!strings.Contains(rec.Body.String(), `"kafka":"brokers [b:9092] do not answer"`) {
		t.Errorf("/readyz without Postgres and Kafka: %d %s, want 503 naming both and why", rec.Code, rec.Body)
	}
}

// Start serves until Stop, which returns once the server has stopped.
func TestServerStartStop(t *testing.T) {
	srv, err := api.Start("127.0.0.1:0", api.NewMux(nil, api.PostgresCheck(sinktest.Pool(t))))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + srv.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := srv.Stop(t.Context()); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if _, err := http.Get("http://" + srv.Addr() + "/healthz"); err == nil {
		t.Error("the server still answers after Stop")
	}
	if _, err := api.Start(srv.Addr()+"x", nil); err == nil || !strings.Contains(err.Error(), "http.addr") {
		t.Errorf("a bad address: %v, want an error naming http.addr", err)
	}
}
