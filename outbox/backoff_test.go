package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// A relay whose every attempt fails (here: no outbox table yet, as with
// Postgres down) waits longer after each failure, up to MaxBackoff, and
// warns on the first failure and then about once a minute of waiting, not
// on every attempt. Once an attempt succeeds it says so and polls at Poll
// again.
func TestRelayBacksOffAndLogsSparselyWhileFailing(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool) // no outbox table: every claim fails
	_, _, brokers := setup(t)
	var logs strings.Builder
	r := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	const failures = 40
	var waits []time.Duration
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r.sleep = func(ctx context.Context, d time.Duration) bool {
		waits = append(waits, d)
		switch len(waits) {
		case failures:
			if err := Migrate(ctx, pool, schema); err != nil { // Postgres is back
				t.Error(err)
				return false
			}
		case failures + 1:
			cancel()
			return false
		}
		return true
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if len(waits) != failures+1 {
		t.Fatalf("%d waits, want %d", len(waits), failures+1)
	}
	poll, most := 100*time.Millisecond, 30*time.Second // the defaults
	if waits[0] != poll || waits[failures-1] != most || waits[failures] != poll {
		t.Errorf("waits: first %v, last failing %v, after the success %v; want %v, %v, %v", waits[0], waits[failures-1], waits[failures], poll, most, poll)
	}
	for i := 1; i < failures; i++ {
		if waits[i] < waits[i-1] || waits[i] > most {
			t.Errorf("wait %d is %v after %v: want longer waits while failing, up to %v", i, waits[i], waits[i-1], most)
		}
	}
	var warns, recovered int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		switch rec["level"] {
		case "WARN":
			warns++
			if rec["attempts"] == nil || rec["retry_in"] == nil {
				t.Errorf("warning %q lacks attempts or retry_in", line)
			}
		case "INFO":
			if strings.Contains(rec["msg"].(string), "publishing again") {
				recovered++
			}
		}
	}
	// The first failure, then one per minute of waiting: the waits add up
	// to about 16 minutes.
	if warns < 2 || warns > 20 || recovered != 1 {
		t.Errorf("%d warnings over %d failed attempts, %d recoveries logged; want a few warnings, one recovery:\n%s", warns, failures, recovered, logs.String())
	}
}
