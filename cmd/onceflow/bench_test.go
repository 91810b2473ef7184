package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// benchUser makes a schema standing for the user's, with a payments
// table holding one row, and a config whose SQL handler writes payments
// unqualified (the DSN puts the schema on the search_path), on topic.
func benchUser(t *testing.T, brokers, topic, sql string) (schema, config string) {
	t.Helper()
	pool := sinktest.Pool(t)
	schema = freshSchema(t, pool, "test_benchuser_")
	if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.payments (event_id uuid, account text, amount numeric(12,2), paid_at timestamptz);
INSERT INTO `+schema+`.payments VALUES ('7f8a0000-0000-4000-8000-000000000001', 'acct-0', 1, now())`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DO $$DECLARE s text; BEGIN
FOR s IN SELECT nspname FROM pg_namespace WHERE nspname LIKE '`+schema+`\_b\_%' LOOP EXECUTE 'DROP SCHEMA ' || s || ' CASCADE'; END LOOP; END$$`)
	})
	dsn := sinktest.DSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	config = writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  group: payments-sink
postgres:
  dsn: %s
  schema: sink
log:
  level: warn
sql_handlers:
  - name: payments
    sql: |
      %s
`, brokers, topic, dsn+sep+"search_path="+schema, strings.ReplaceAll(sql, "\n", "\n      ")))
	return schema, config
}

const benchPaymentsSQL = `INSERT INTO payments (event_id, account, amount, paid_at)
SELECT event_id, payload->>'account', (payload->>'amount')::numeric, "timestamp"
FROM events`

// `onceflow bench` on a config with one SQL handler: the report with both
// baselines, every run exactly once, results.json and results.md, and
// --compare; the user's table is not written, the schemas are dropped,
// and on a real Kafka the topic bench made is deleted and the config's
// topic never created.
func TestBenchCommand(t *testing.T) {
	brokers := map[string]string{"kfake": "127.0.0.1:1"} // unused: embedded
	if addrs := os.Getenv(envKafka); addrs != "" {
		brokers["kafka"] = addrs
	} else if os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "" {
		t.Fatalf("%s is not set and CI is: this test must also run on a real Kafka (infra/kafka.sh start)", envKafka)
	}
	for name, addrs := range brokers {
		t.Run(name, func(t *testing.T) {
			topic := "payments-" + randomHex(4)
			schema, config := benchUser(t, addrs, topic, benchPaymentsSQL)
			tmpl := filepath.Join(t.TempDir(), "payment.json")
			if err := os.WriteFile(tmpl, []byte(`{"account": "acct-{{int 1 50}}", "amount": "{{decimal 0.01 999.99 2}}"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out")
			common := []string{"bench", "--config", config, "--template", tmpl, "--events", "300", "--partitions", "3", "--members", "2",
				"--bench-schema", schema + "_b"}
			args := append(slices.Clone(common), "--scenarios", "steady,replay", "--out", out)
			if name == "kafka" {
				args = append(args, "--brokers")
			}
			var stderr bytes.Buffer
			stdout, err := runCLI(t, &stderr, args...)
			if err != nil {
				t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
			}
			for _, w := range []string{"effects-only", "raw-copy", "steady", "replay", "price of exactly-once: 1 − steady/effects-only = "} {
				if !strings.Contains(stdout, w) {
					t.Fatalf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			if !strings.HasPrefix(strings.TrimLeft(stdout, " "), "run ") {
				t.Errorf("stdout does not begin with the table's header:\n%q", stdout)
			}
			if strings.Contains(stdout, "NO") {
				t.Fatalf("a run not exactly once:\n%s", stdout)
			}
			for _, f := range []string{"results.json", "results.md"} {
				if _, err := os.Stat(filepath.Join(out, f)); err != nil {
					t.Fatal(err)
				}
			}
			pool := sinktest.Pool(t)
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.payments`); n != 1 {
				t.Fatalf("the user's payments has %d rows, want its 1", n)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, schema+"_b%"); n != 0 {
				t.Fatalf("%d bench schemas left", n)
			}
			if name == "kafka" {
				cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addrs, ",")...))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				ts, err := kadm.NewClient(cl).ListTopics(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range ts.Names() {
					if strings.HasPrefix(n, topic) {
						t.Fatalf("topic %s exists after bench (the config's topic is %s)", n, topic)
					}
				}
				return
			}
			stdout, err = runCLI(t, &stderr, append(common, "--scenarios", "steady", "--rounds", "2", "--out", t.TempDir(),
				"--compare", filepath.Join(out, "results.json"))...)
			if err != nil {
				t.Fatalf("bench --compare: %v\nstderr:\n%s", err, stderr.String())
			}
			if !strings.Contains(stdout, "compared with ") || !strings.Contains(stdout, "before: price of exactly-once") ||
				!strings.Contains(stdout, "replay") {
				t.Fatalf("--compare printed no difference:\n%s", stdout)
			}
		})
	}
}

// A handler that writes a table by its schema-qualified name cannot be
// redirected: bench refuses, naming it, and writes nothing.
func TestBenchRefusesQualifiedTable(t *testing.T) {
	topic := "payments-" + randomHex(4)
	var schema string
	schema, config := benchUser(t, "127.0.0.1:1", topic, "") // placeholder SQL, rewritten below
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(string(b), "sql: |\n      \n", "sql: |\n      INSERT INTO "+schema+".payments (event_id) SELECT event_id FROM events\n", 1)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	sample := filepath.Join(t.TempDir(), "s.jsonl")
	if err := os.WriteFile(sample, []byte("{\"a\":1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	_, err = runCLI(t, &stderr, "bench", "--config", config, "--sample", sample, "--events", "10", "--bench-schema", schema+"_b", "--out", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "handler payments still writes "+schema+".payments, outside the bench schema") {
		t.Fatalf("bench with a qualified table: %v, want a refusal naming %s.payments", err, schema)
	}
	pool := sinktest.Pool(t)
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.payments`); n != 1 {
		t.Fatalf("the user's payments has %d rows, want its 1", n)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, schema+"_b%"); n != 0 {
		t.Fatalf("%d bench schemas left", n)
	}
}
