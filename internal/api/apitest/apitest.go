package apitest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Client sends requests to the server at Base ("http://host:port") and
// fails T on a transport error or an answer that is not a JSON object.
type Client struct {
	T    testing.TB
	Base string
}

// Do sends a request with a JSON content type and headers, and returns the
// status, the headers and the decoded JSON object.
func (c Client) Do(method, path string, headers map[string]string, body string) (int, http.Header, map[string]any) {
	c.T.Helper()
	req, err := http.NewRequest(method, c.Base+path, strings.NewReader(body))
	if err != nil {
		c.T.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.T.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		c.T.Fatalf("%s %s answered non-JSON %q", method, path, raw)
	}
	return resp.StatusCode, resp.Header, out
}

// Post posts an order body to /events-outbox/kafka with an Idempotency-Key.
func (c Client) Post(key, body string) (int, http.Header, map[string]any) {
	c.T.Helper()
	return c.Do("POST", "/events-outbox/kafka", map[string]string{"Idempotency-Key": key}, body)
}
