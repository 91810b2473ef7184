package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/demo"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// TestMain checks that no goroutine outlives the tests, except the
// keep-alive connections of HTTP clients: the OTLP/HTTP exporter's own
// transport keeps its idle connection to Jaeger after Shutdown.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
}

// runCLI runs the onceflow command line with args, returning stdout and
// the error.
func runCLI(t *testing.T, stderr io.Writer, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

// The demo's JSON summary matches what the tables hold, every effect
// happened once, and /metrics serves the pipeline's metrics while it runs.
func TestDemoJSONMatchesTablesAndServesMetrics(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_demo_")

	pr, pw := io.Pipe()
	scraped := make(chan map[string]*dtoFamily, 1)
	go scrapeWhileRunning(pr, scraped)
	out, err := runCLI(t, pw, "demo", "--json", "--events", "3000", "--partitions", "4", "--members", "2",
		"--rebalance-every", "300ms", "--dsn", dsn, "--demo-schema", schema, "--http-addr", "127.0.0.1:0")
	pw.Close()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	var sum demo.Summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("demo output is not one JSON object: %v\n%s", err, out)
	}
	if !sum.ExactlyOnce || len(sum.Problems) > 0 {
		t.Errorf("demo says exactly_once=%v, problems %v", sum.ExactlyOnce, sum.Problems)
	}
	for _, tc := range []struct {
		name string
		got  int64
		sql  string
	}{
		{"emails_sent", sum.EmailsSent, `SELECT count(*) FROM ` + schema + `.emails_sent`},
		{"processed_events_total", sum.ProcessedTotal, `SELECT count(*) FROM ` + schema + `.processed_events`},
		{"analytics_orders", sum.OrdersCounter, `SELECT sum(value)::bigint FROM ` + schema + `.analytics_counters WHERE name = 'orders'`},
		{"analytics_items", sum.ItemsCounter, `SELECT sum(value)::bigint FROM ` + schema + `.analytics_counters WHERE name = 'items'`},
		{"inventory_reserved", sum.ItemsReserved, `SELECT sum(reserved)::bigint FROM ` + schema + `.inventory_reserved`},
		{"dead_letters", sum.DeadLetters, `SELECT count(*) FROM ` + schema + `.dead_letters`},
	} {
		if want := sinktest.Count(t, pool, tc.sql); tc.got != want {
			t.Errorf("summary %s = %d, psql finds %d", tc.name, tc.got, want)
		}
	}
	if sum.UniqueEvents != 3000 || sum.EmailsSent != 3000 || sum.ProcessedTotal != 4*3000 {
		t.Errorf("summary: %d unique, %d emails, %d processed rows; want 3000, 3000, 12000",
			sum.UniqueEvents, sum.EmailsSent, sum.ProcessedTotal)
	}
	dups := int64(sum.DuplicatesPublished+sum.ReplayedEvents) * 4
	if sum.SkippedLRU+sum.SkippedPostgres != dups {
		t.Errorf("skipped %d+%d pairs, want %d (every duplicate record, four handlers)", sum.SkippedLRU, sum.SkippedPostgres, dups)
	}
	if sum.MembersCrashed < 1 || sum.MembersLeft < 1 {
		t.Errorf("members left %d, crashed %d; the demo must churn both ways", sum.MembersLeft, sum.MembersCrashed)
	}

	fams := <-scraped
	if fams == nil {
		t.Fatal("never scraped /metrics while the demo ran")
	}
	for _, name := range []string{"onceflow_records_consumed_total", "onceflow_events_applied_total",
		"onceflow_duplicates_skipped_total", "onceflow_dead_letters_total", "onceflow_batch_records",
		"onceflow_batch_duration_seconds", "onceflow_transaction_retries_total", "onceflow_rebalance_partitions_total",
		"onceflow_partition_lag", "onceflow_lru_size", "onceflow_lru_hit_ratio"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if f := fams["onceflow_records_consumed_total"]; f != nil && f.value <= 0 {
		t.Errorf("onceflow_records_consumed_total = %v while consuming, want > 0", f.value)
	}
}

type dtoFamily struct{ value float64 }

// scrapeWhileRunning reads the demo's stderr for the metrics address,
// scrapes it every 50ms while the demo runs (and on every progress line),
// and sends the union of the families seen (each with its largest value),
// or nil if it never scraped. Some families, such as per-partition lag,
// exist only while a partition is assigned, and the demo's members churn
// every few hundred milliseconds: a scrape per progress line alone can
// fall into rebalances only, on a loaded machine.
func scrapeWhileRunning(r io.Reader, out chan<- map[string]*dtoFamily) {
	sc := bufio.NewScanner(r)
	var (
		mu   sync.Mutex
		seen map[string]*dtoFamily
	)
	merge := func(url string) {
		fams := scrape(url)
		mu.Lock()
		defer mu.Unlock()
		for name, f := range fams {
			if seen == nil {
				seen = map[string]*dtoFamily{}
			}
			if old := seen[name]; old == nil || f.value > old.value {
				seen[name] = f
			}
		}
	}
	done := make(chan struct{})
	var ticking sync.WaitGroup
	var url string
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, "metrics on "); i >= 0 && url == "" {
			url = strings.TrimSpace(line[i+len("metrics on "):])
			ticking.Add(1)
			go func() {
				defer ticking.Done()
				for {
					select {
					case <-done:
						return
					case <-time.After(50 * time.Millisecond):
						merge(url)
					}
				}
			}()
		}
		if url != "" && strings.Contains(line, "consumed") {
			merge(url)
		}
	}
	close(done)
	ticking.Wait()
	mu.Lock()
	defer mu.Unlock()
	out <- seen
}

func scrape(url string) map[string]*dtoFamily {
	resp, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil
	}
	fams := map[string]*dtoFamily{}
	for name, mf := range parsed {
		f := &dtoFamily{}
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				f.value += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				f.value += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				f.value += float64(m.GetHistogram().GetSampleCount())
			}
		}
		fams[name] = f
	}
	return fams
}

// A misspelled key or a bad broker address fails at start, naming it.
func TestBadConfigFailsAtStart(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"misspelled key", []string{"run", "--config", write("typo.yaml", "kafka:\n  brokers: [127.0.0.1:9092]\nbatch:\n  max_recods: 10\n")},
			[]string{"invalid configuration", "max_recods"}},
		{"bad broker address", []string{"run", "--brokers", "kafka.internal"},
			[]string{"kafka.brokers", `"kafka.internal" is not host:port`}},
		{"two problems at once", []string{"migrate", "--brokers", "nohost", "--log-level", "loud"},
			[]string{"kafka.brokers", "log.level"}},
		{"bad demo flags", []string{"demo", "--events", "0", "--partitions", "0"},
			[]string{"--events 0", "--partitions 0"}},
		{"unknown handler", []string{"migrate", "--handlers", "emailHandler,smsHandler"},
			[]string{`handlers: unknown handler "smsHandler"`, "known: emailHandler, inventoryHandler, analyticsHandler, recommenderHandler"}},
		// With the other problems, not after they are mended.
		{"unknown handler and another problem", []string{"migrate", "--handlers", "emailHandler,smsHandler", "--log-level", "loud"},
			[]string{`handlers: unknown handler "smsHandler"`, "log.level"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runCLI(t, io.Discard, tc.args...)
			if err == nil {
				t.Fatal("the command started with a bad configuration")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// freshSchema returns a unique schema name with the given prefix, dropped
// at cleanup. The command under test creates it.
func freshSchema(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := prefix + hex.EncodeToString(b[:])
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	return schema
}

// `onceflow audit` shows an event's outbox row, a broker's refusal
// included, next to what the consumer side recorded.
func TestAuditShowsOutboxFailure(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_audit_")
	if _, err := runCLI(t, io.Discard, "migrate", "--dsn", dsn, "--schema", schema); err != nil {
		t.Fatal(err)
	}
	id := "7f8a0000-0000-0000-0000-0000000000f1"
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+schema+`.outbox (event_id, bus, topic, payload, failed_at, fail_reason)
VALUES ($1, 'kafka', 'orders', '{}', now(), 'MESSAGE_TOO_LARGE: over the limit')`, id); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, io.Discard, "audit", id, "--dsn", dsn, "--schema", schema)
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		EventID string `json:"event_id"`
		Outbox  struct {
			Count      int     `json:"count"`
			Published  bool    `json:"published"`
			FailedAt   *string `json:"failed_at"`
			FailReason string  `json:"fail_reason"`
		} `json:"outbox"`
		Processed []any `json:"processed"`
	}
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		t.Fatalf("audit output: %v\n%s", err, out)
	}
	if a.EventID != id || a.Outbox.Count != 1 || a.Outbox.Published || a.Outbox.FailedAt == nil ||
		a.Outbox.FailReason != "MESSAGE_TOO_LARGE: over the limit" || a.Processed == nil {
		t.Errorf("audit = %s", out)
	}
}
