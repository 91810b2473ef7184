package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/api"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// rawAnswer is an answer read whatever its shape.
type rawAnswer struct {
	code   int
	header http.Header
	errMsg string // the JSON error field; "" when absent
	body   string
}

// send sends a request as a client would, with the content type given
// (none when empty), and reads the answer whatever it is.
func send(t *testing.T, url, method, path, contentType string, headers map[string]string, body string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := rawAnswer{code: resp.StatusCode, header: resp.Header, body: string(raw)}
	var m map[string]any
	if json.Unmarshal(raw, &m) == nil {
		a.errMsg, _ = m["error"].(string)
	}
	return a
}

// No input to the API is answered with a 5xx: each is refused with a 4xx
// and a JSON error naming the problem, or accepted. Inputs Postgres itself
// refuses (a \u0000 escape, a number out of numeric's range, a constraint
// of the table) are the caller's fault and are said so.
func TestNoInputGivesA5xx(t *testing.T) {
	s := newSeed(t)
	// An operator's constraint on the orders table: a Postgres refusal of
	// the caller's data that no check of the API knows about.
	if _, err := s.pool.Exec(t.Context(), `ALTER TABLE `+s.schema+`.orders
ADD CONSTRAINT orders_user_id_below_1e9 CHECK (user_id < 1000000000)`); err != nil {
		t.Fatal(err)
	}
	key := func(n int) map[string]string {
		return map[string]string{"Idempotency-Key": fmt.Sprintf("7f8a0000-0000-0000-0000-%012x", 0xc00+n)}
	}
	// An order to replay.
	stored := "7f8a0000-0000-0000-0000-0000000000e1"
	if code, _, body := s.post(stored, order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	const json = "application/json"
	deep := `{"user_id":1,"items":["A"],"x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`
	for i, tc := range []struct {
		name        string
		method      string
		path        string
		contentType string
		headers     map[string]string
		body        string
		code        int
		want        string // in the JSON error; "" for an accepted request
	}{
		// The two cases reported.
		{"item with a \\u0000 escape", "POST", "/events-outbox/kafka", json, key(1), `{"user_id":1,"items":["A\u0000B"]}`, 400, `\u0000`},
		{"raw NUL byte", "POST", "/events-outbox/kafka", json, key(2), "{\"user_id\":1,\"items\":[\"A\x00B\"]}", 400, "NUL"},
		// What else a body can hold that Postgres refuses.
		{"\\u0000 in another field", "POST", "/events-outbox/kafka", json, key(3), `{"user_id":1,"items":["A"],"note":"\u0000"}`, 400, `\u0000`},
		{"an escaped backslash before u0000 is text", "POST", "/events-outbox/kafka", json, key(40), `{"user_id":1,"items":["C:\\u0000dir"]}`, 200, ""},
		{"invalid UTF-8", "POST", "/events-outbox/kafka", json, key(4), "{\"user_id\":1,\"items\":[\"A\xff\xfeB\"]}", 400, "UTF-8"},
		{"number beyond numeric", "POST", "/events-outbox/kafka", json, key(5), `{"user_id":1,"items":["A"],"n":1e999999}`, 400, "SQLSTATE 22003"},
		{"a table's constraint", "POST", "/events-outbox/kafka", json, key(6), `{"user_id":2000000000,"items":["A"]}`, 422, "orders_user_id_below_1e9"},
		{"user_id beyond bigint", "POST", "/events-outbox/kafka", json, key(7), `{"user_id":99999999999999999999,"items":["A"]}`, 400, "user_id"},
		{"user_id a fraction", "POST", "/events-outbox/kafka", json, key(8), `{"user_id":1.5,"items":["A"]}`, 400, "user_id"},
		{"user_id negative", "POST", "/events-outbox/kafka", json, key(9), `{"user_id":-1,"items":["A"]}`, 400, "user_id must be a positive integer"},
		{"nested too deep", "POST", "/events-outbox/kafka", json, key(10), deep, 400, "not an order"},
		{"empty body", "POST", "/events-outbox/kafka", json, key(11), "", 400, "body is empty"},
		{"blank body", "POST", "/events-outbox/kafka", json, key(12), " \n", 400, "body is empty"},
		{"null", "POST", "/events-outbox/kafka", json, key(13), "null", 400, "not an order"},
		{"an array", "POST", "/events-outbox/kafka", json, key(14), "[1,2]", 400, "not an order"},
		{"over 1 MiB", "POST", "/events-outbox/kafka", json, key(15), `{"user_id":1,"items":["` + strings.Repeat("A", 1<<20) + `"]}`, 413, "over 1 MiB"},
		{"no content type", "POST", "/events-outbox/kafka", "", key(16), order, 200, ""},
		{"curl's form content type", "POST", "/events-outbox/kafka", "application/x-www-form-urlencoded", key(17), order, 200, ""},
		{"text content type, not an order", "POST", "/events-outbox/kafka", "text/plain", key(18), "hello", 400, "not an order"},
		// Keys and ids.
		{"over-long Idempotency-Key", "POST", "/events-outbox/kafka", json, map[string]string{"Idempotency-Key": strings.Repeat("7", 8000)}, order, 400, "is not a UUID"},
		{"Idempotency-Key in braces", "POST", "/events-outbox/kafka", json, map[string]string{"Idempotency-Key": "{7f8a0000-0000-0000-0000-0000000000e2}"}, order, 400, "is not a UUID"},
		{"audit of a long id", "GET", "/audit/event/" + strings.Repeat("a", 5000), "", nil, "", 400, "is not a UUID"},
		{"audit of an escaped NUL", "GET", "/audit/event/%00", "", nil, "", 400, "is not a UUID"},
		{"audit of a URN", "GET", "/audit/event/urn:uuid:7f8a0000-0000-0000-0000-0000000000e1", "", nil, "", 400, "is not a UUID"},
		{"replay of a long id", "POST", "/demo/replay-event/" + strings.Repeat("9", 5000), "", nil, "", 400, "is not a UUID"},
		{"replay of an id never enqueued", "POST", "/demo/replay-event/7f8a0000-0000-0000-0000-0000000000e3", "", nil, "", 404, "no event"},
		{"replay with a \\u0000 body", "POST", "/demo/replay-event/" + stored, json, nil, `{"user_id":1,"items":["\u0000"]}`, 400, `\u0000`},
		{"replay with invalid UTF-8", "POST", "/demo/replay-event/" + stored, json, nil, "{\"user_id\":1,\"items\":[\"\xff\"]}", 400, "UTF-8"},
		{"replay with a number beyond numeric", "POST", "/demo/replay-event/" + stored, json, nil, `{"user_id":1,"items":["A"],"n":1e999999}`, 400, "SQLSTATE 22003"},
		// Methods.
		{"GET the outbox", "GET", "/events-outbox/kafka", "", nil, "", 405, "POST"},
		{"PUT an order", "PUT", "/events-outbox/kafka", json, key(19), order, 405, "POST"},
		{"DELETE an audit", "DELETE", "/audit/event/" + stored, "", nil, "", 405, "GET"},
		{"GET a replay", "GET", "/demo/replay-event/" + stored, "", nil, "", 405, "POST"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := send(t, s.url, tc.method, tc.path, tc.contentType, tc.headers, tc.body)
			t.Logf("%d %s", a.code, truncate(a.errMsg))
			if a.code != tc.code {
				t.Errorf("case %d: got %d %q, want %d", i, a.code, truncate(a.body), tc.code)
			}
			if tc.want != "" && !strings.Contains(a.errMsg, tc.want) {
				t.Errorf("case %d: error %q (answer %q), want a JSON error with %q", i, truncate(a.errMsg), truncate(a.body), tc.want)
			}
			if len(a.body) > 2000 {
				t.Errorf("an answer of %d bytes: what the caller sent is not echoed whole", len(a.body))
			}
			if a.code == 405 && a.header.Get("Allow") == "" {
				t.Errorf("a 405 without an Allow header")
			}
		})
	}
	// Only the stored order and the three accepted ones were written.
	if n := sinktest.Count(t, s.pool, `SELECT count(*) FROM `+s.schema+`.outbox`); n != 4 {
		t.Errorf("outbox has %d rows, want 4 (no refused request writes one)", n)
	}
	if len(s.pub.recs) != 0 {
		t.Errorf("published %d replays, want none", len(s.pub.recs))
	}
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// Postgres that does not answer is 503 with a Retry-After on every
// endpoint, never a 500: the client is to try again.
func TestPostgresDownIs503(t *testing.T) {
	dead, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	store, err := outbox.NewStore(dead, outbox.StoreConfig{Schema: "nowhere", Topic: "orders", SamePayload: orders.Same})
	if err != nil {
		t.Fatal(err)
	}
	seed, err := api.NewSeed(api.SeedConfig{Pool: dead, Store: store, Publisher: &published{}, Schema: "nowhere", Bus: "kafka", Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	seed.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	id := "7f8a0000-0000-0000-0000-0000000000d1"
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/events-outbox/kafka", order},
		{"GET", "/audit/event/" + id, ""},
		{"POST", "/demo/replay-event/" + id, ""},
	} {
		a := send(t, srv.URL, tc.method, tc.path, "application/json", map[string]string{"Idempotency-Key": id}, tc.body)
		if a.code != 503 || a.header.Get("Retry-After") == "" || !strings.Contains(a.errMsg, "Postgres") {
			t.Errorf("%s %s with Postgres down: %d Retry-After %q %q, want 503 with Retry-After naming Postgres",
				tc.method, tc.path, a.code, a.header.Get("Retry-After"), a.body)
		}
	}
}
