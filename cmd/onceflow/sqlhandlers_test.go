package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// envKafka names the environment variable with a real Kafka's brokers, as
// in the processor's suite.
const envKafka = "ONCEFLOW_TEST_KAFKA_BROKERS"

// testBrokers is each Kafka the binary tests run against: kfake (it
// listens on TCP, so another process reaches it), and the real broker when
// envKafka is set. With CI set, the real broker is required unless
// ONCEFLOW_TEST_KFAKE_ONLY is.
func testBrokers(t *testing.T) map[string]func(t *testing.T) []string {
	bs := map[string]func(t *testing.T) []string{"kfake": func(t *testing.T) []string {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c.ListenAddrs()
	}}
	switch addrs := os.Getenv(envKafka); {
	case addrs != "":
		bs["kafka"] = func(*testing.T) []string { return strings.Split(addrs, ",") }
	case os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "":
		t.Fatalf("%s is not set and CI is: this test must also run on a real Kafka (infra/kafka.sh start)", envKafka)
	}
	return bs
}

// createTopic creates topic with partitions on seeds and deletes it at
// cleanup.
func createTopic(t *testing.T, seeds []string, topic string, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})
}

// onceflowBinary builds cmd/onceflow once per test run and returns its
// path.
func onceflowBinary(t *testing.T) string {
	t.Helper()
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// A user with their own topic and table, and a config with one SQL
// handler, gets each event's effect exactly once from the built binary:
// `onceflow produce` sends the records, one of them twice and one whose
// cast fails; `onceflow run` applies them; the failing one is a dead
// letter and its neighbours apply; `onceflow audit` shows the handler's
// row. The effects table has no unique key, so a double apply shows.
func TestBinaryRunsSQLHandlerOnOwnTopic(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	bin := onceflowBinary(t)
	for name, start := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			seeds := start(t)
			schema := freshSchema(t, pool, "test_sqlh_")
			topic := "payments-" + randomHex(4)
			createTopic(t, seeds, topic, 2)
			if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.payments (event_id uuid, account text, amount numeric(12,2), kafka_offset bigint)`); err != nil {
				t.Fatal(err)
			}
			config := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  group: %s
  dead_letter_topic: ""
postgres:
  dsn: %s
  schema: %s
http:
  addr: 127.0.0.1:0
log:
  level: warn
sql_handlers:
  - name: payments
    sql: |
      INSERT INTO %s.payments (event_id, account, amount, kafka_offset)
      SELECT event_id, payload->>'account', (payload->>'amount')::numeric, "offset"
      FROM events
`, strings.Join(seeds, ", "), topic, "g-"+topic, dsn, schema, schema))

			const n, bad, again = 12, 5, 3
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("7f8a0000-0000-4000-8000-%012d", i)
			}
			value := func(i int) string {
				if i == bad {
					return `{"account":"acct-5","amount":"twelve"}`
				}
				return fmt.Sprintf(`{"account":"acct-%d","amount":"%d.50"}`, i, i)
			}
			produced := 0
			produce := func(i int) {
				t.Helper()
				out, err := exec.Command(bin, "produce", "--config", config, "--topic", topic,
					"--header", "event_id="+ids[i], value(i)).CombinedOutput()
				if err != nil {
					t.Fatalf("onceflow produce: %v\n%s", err, out)
				}
				produced++
			}
			for i := range 6 {
				produce(i)
			}
			produce(again) // the same event again, as a producer's retry sends it

			cmd, stderr, exited := startRun(t, bin, "run", "--config", config)
			waitApplied(t, pool, schema, topic, 7, exited, stderr)
			for i := 6; i < n; i++ {
				produce(i)
			}
			produce(again) // and once more, after it was applied
			waitApplied(t, pool, schema, topic, produced, exited, stderr)
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				exited <- err // for the cleanup
				if err != nil {
					t.Fatalf("onceflow run after SIGTERM: %v\n%s", err, stderr.String())
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("onceflow run did not drain within 60s of SIGTERM\n%s", stderr.String())
			}

			for _, tc := range []struct {
				name string
				sql  string
				want int64
			}{
				{"payments rows", `SELECT count(*) FROM ` + schema + `.payments`, n - 1},
				{"distinct events in payments", `SELECT count(DISTINCT event_id) FROM ` + schema + `.payments`, n - 1},
				{"payments of the bad event", `SELECT count(*) FROM ` + schema + `.payments WHERE event_id = '` + ids[bad] + `'`, 0},
				{"payments of the redelivered event", `SELECT count(*) FROM ` + schema + `.payments WHERE event_id = '` + ids[again] + `'`, 1},
				{"amounts", `SELECT sum(amount * 100)::bigint FROM ` + schema + `.payments`, sumAmounts(n, bad)},
				{"processed rows of the handler", `SELECT count(*) FROM ` + schema + `.processed_events WHERE handler = 'payments'`, n - 1},
				{"processed rows of other handlers", `SELECT count(*) FROM ` + schema + `.processed_events WHERE handler <> 'payments'`, 0},
				{"dead letters", `SELECT count(*) FROM ` + schema + `.dead_letters`, 1},
				{"the bad event's dead letter", `SELECT count(*) FROM ` + schema + `.dead_letters WHERE event_id = '` + ids[bad] + `' AND reason LIKE '%22P02%'`, 1},
			} {
				if got := sinktest.Count(t, pool, tc.sql); got != tc.want {
					t.Errorf("%s = %d, want %d", tc.name, got, tc.want)
				}
			}

			out, err := exec.Command(bin, "audit", ids[again], "--config", config).Output()
			if err != nil {
				t.Fatalf("onceflow audit: %v", err)
			}
			var audit struct {
				Processed []struct {
					Handler string `json:"handler"`
				} `json:"processed"`
			}
			if err := json.Unmarshal(out, &audit); err != nil {
				t.Fatalf("audit output: %v\n%s", err, out)
			}
			if len(audit.Processed) != 1 || audit.Processed[0].Handler != "payments" {
				t.Errorf("audit of the redelivered event shows processed %+v, want one row of handler payments\n%s", audit.Processed, out)
			}
			if bytes.Contains(out, []byte(`"emails_sent"`)) || bytes.Contains(out, []byte(`"outbox"`)) {
				t.Errorf("audit of a pipeline without the demo's tables shows the demo's parts:\n%s", out)
			}
			for _, demoTable := range []string{"emails_sent", "outbox", "orders"} {
				if n := sinktest.Count(t, pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = $2`, schema, demoTable); n != 0 {
					t.Errorf("run with only sql_handlers created the demo's table %s.%s", schema, demoTable)
				}
			}

			// The group stopped: a dry run of a replay from the start counts
			// the SQL handler's pairs, every one skipped as applied.
			out, err = exec.Command(bin, "replay", "--to-start", "--dry-run", "--config", config).CombinedOutput()
			if err != nil {
				t.Fatalf("onceflow replay --dry-run: %v\n%s", err, out)
			}
			if !bytes.Contains(out, []byte("payments")) {
				t.Errorf("replay --dry-run does not count the SQL handler payments:\n%s", out)
			}
		})
	}
}

// sumAmounts is the sum in cents of the amounts value gives events 0..n-1
// but bad.
func sumAmounts(n, bad int) int64 {
	var s int64
	for i := range n {
		if i != bad {
			s += int64(i)*100 + 50
		}
	}
	return s
}

// waitApplied waits until the offsets stored for topic add up to records,
// failing if run exits first or it takes over 60s.
// startRun starts the built binary bin with args (an `onceflow run`) and
// kills it at cleanup. It returns the process, its standard error, and
// exited, which receives Wait's result once: a test that reads it sends
// it back, for the cleanup.
func startRun(t *testing.T, bin string, args ...string) (*exec.Cmd, *bytes.Buffer, chan error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return cmd, stderr, exited
}

func waitApplied(t *testing.T, pool *pgxpool.Pool, schema, topic string, records int, exited chan error, stderr *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got int64
		_ = pool.QueryRow(t.Context(), `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets WHERE topic = $1`,
			topic).Scan(&got)
		if got >= int64(records) {
			return
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("onceflow run exited early: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("onceflow run stored offsets for %d of %d records in 60s\n%s", got, records, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A statement Postgres refuses fails the start, naming the handler and
// carrying Postgres' message; so does a config naming a handler twice.
func TestRunFailsOnBadSQLHandler(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_sqlh_")
	config := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [127.0.0.1:1]
  topics: [payments]
postgres:
  dsn: %s
  schema: %s
http:
  addr: ""
sql_handlers:
  - name: ledger
    sql: |
      INSERT INTO %s.ledger (event_id)
      SELECT event_id FROM events
`, dsn, schema, schema))
	_, err := runCLI(t, io.Discard, "run", "--config", config)
	if err == nil {
		t.Fatal("run started with a statement over a missing table")
	}
	for _, want := range []string{`sql_handlers[0]`, `handler "ledger"`, `relation "` + schema + `.ledger" does not exist`, "42P01", "line 1 column 13"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("run error does not mention %q:\n%v", want, err)
		}
	}
}

// With decode.format bytes and event ids derived from offsets, a SQL
// handler sees raw values, keys and headers; a second consumer group
// reading the same records again (a replay: the same records redelivered)
// applies nothing twice.
func TestRunRawValuesWithOffsetIDs(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	for name, start := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			seeds := start(t)
			schema := freshSchema(t, pool, "test_sqlh_")
			topic := "raw-" + randomHex(4)
			createTopic(t, seeds, topic, 1)
			if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.raw (event_id uuid, value bytea, key text, h text, kafka_offset bigint, payload jsonb)`); err != nil {
				t.Fatal(err)
			}
			const n = 5
			cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for i := range n {
				r := &kgo.Record{Topic: topic, Value: []byte{0, 0xff, byte('a' + i)}, Key: []byte(fmt.Sprintf("k%d", i)),
					Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(fmt.Sprintf("v%d", i))}}}
				if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			config := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  dead_letter_topic: ""
postgres:
  dsn: %s
  schema: %s
http:
  addr: ""
log:
  level: warn
decode:
  format: bytes
  event_id_source: offset
sql_handlers:
  - name: raw
    sql: |
      INSERT INTO %s.raw
      SELECT event_id, value, convert_from(key, 'UTF8'), headers->>'h', "offset", payload FROM events
`, strings.Join(seeds, ", "), topic, dsn, schema, schema))
			for _, group := range []string{"first-" + topic, "replay-" + topic} {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				root := newRoot()
				root.SetOut(io.Discard)
				var stderr bytes.Buffer
				root.SetErr(&stderr)
				root.SetArgs([]string{"run", "--config", config, "--group", group})
				go func() { done <- root.ExecuteContext(ctx) }()
				waitGroupApplied(t, pool, schema, group, n, done)
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("run (group %s): %v", group, err)
				}
			}
			if got := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.raw`); got != n {
				t.Errorf("%d rows, want %d: each record once over two groups", got, n)
			}
			var id [16]byte
			var value []byte
			var key, h string
			var payload *string
			if err := pool.QueryRow(t.Context(), `SELECT event_id, value, key, h, payload::text FROM `+schema+`.raw WHERE kafka_offset = 2`).
				Scan(&id, &value, &key, &h, &payload); err != nil {
				t.Fatal(err)
			}
			if want := processor.OffsetID(topic, 0, 2); id != want {
				t.Errorf("event_id = %x, want OffsetID(%s, 0, 2) = %s", id, topic, want)
			}
			if !bytes.Equal(value, []byte{0, 0xff, 'c'}) || key != "k2" || h != "v2" || payload != nil {
				t.Errorf("row = value %x key %s header %s payload %v, want 00ff63 k2 v2 NULL", value, key, h, payload)
			}
		})
	}
}

// waitGroupApplied waits until group's stored offsets add up to records,
// failing if run returns first or it takes over 60s.
func waitGroupApplied(t *testing.T, pool *pgxpool.Pool, schema, group string, records int, done chan error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got int64
		_ = pool.QueryRow(t.Context(), `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets WHERE consumer_group = $1`,
			group).Scan(&got)
		if got >= int64(records) {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s stored offsets for %d of %d records in 60s", group, got, records)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
