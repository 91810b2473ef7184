package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// The dead-letter topic is what the user configures, or none: a config for
// a topic of its own with no kafka.dead_letter_topic keeps dead letters in
// the dead_letters table, says so once at start, and warns of nothing (it
// used to copy them to orders.dlq, a topic of the demo's, and warn for
// ever where that topic did not exist). A dead_letter_topic that exists
// gets the copies.
func TestRunDeadLetterTopicDefault(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	bin := onceflowBinary(t)
	for name, start := range testBrokers(t) {
		for _, c := range []struct {
			name      string
			dlq       bool // a dead_letter_topic key naming an existing topic
			published bool // the dead letter's copy was published
		}{
			{"no dead_letter_topic key", false, false},
			{"dead_letter_topic exists", true, true},
		} {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				seeds := start(t)
				schema := freshSchema(t, pool, "test_dlq_")
				topic := "payments-" + randomHex(4)
				createTopic(t, seeds, topic, 1)
				key := ""
				if c.dlq {
					createTopic(t, seeds, topic+".dlq", 1)
					key = "  dead_letter_topic: " + topic + ".dlq\n"
				}
				if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.payments (event_id uuid, amount numeric(12,2))`); err != nil {
					t.Fatal(err)
				}
				config := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  group: %s
  produce_timeout: 2s
%spostgres:
  dsn: %s
  schema: %s
http:
  addr: 127.0.0.1:0
handlers: []
sql_handlers:
  - name: payments
    sql: INSERT INTO %s.payments SELECT event_id, (payload->>'amount')::numeric FROM events
`, strings.Join(seeds, ", "), topic, "g-"+topic, key, dsn, schema, schema))
				bad := "7f8a0000-0000-4000-8000-0000000000b2"
				for id, amount := range map[string]string{"7f8a0000-0000-4000-8000-0000000000b1": "1.50", bad: "twelve",
					"7f8a0000-0000-4000-8000-0000000000b3": "3.50"} {
					if out, err := exec.Command(bin, "produce", "--config", config, "--header", "event_id="+id,
						`{"amount":"`+amount+`"}`).CombinedOutput(); err != nil {
						t.Fatalf("onceflow produce: %v\n%s", err, out)
					}
				}

				cmd, stderr, exited := startRun(t, bin, "run", "--config", config)
				waitApplied(t, pool, schema, topic, 3, exited, stderr)
				// The copy is published, or not, from the table after the
				// batch: give the relay its round (a produce is bounded
				// by produce_timeout, 2s) before reading the log.
				deadline := time.Now().Add(6 * time.Second)
				for time.Now().Before(deadline) && !(c.published && published(t, schema, bad) == 1) {
					time.Sleep(100 * time.Millisecond)
				}
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-exited:
					exited <- err
					if err != nil {
						t.Fatalf("onceflow run after SIGTERM: %v\n%s", err, stderr.String())
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("onceflow run did not drain within 60s of SIGTERM\n%s", stderr.String())
				}

				logs := stderr.String()
				// The bad record's own warnings, and nothing else.
				expected := []string{"batch failed on a data error; isolating", "dead letter recorded"}
				for _, line := range strings.Split(logs, "\n") {
					if (strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) &&
						!slices.ContainsFunc(expected, func(e string) bool { return strings.Contains(line, e) }) {
						t.Errorf("the log warns: %s", line)
					}
				}
				const tableOnly = "dead letters are kept in the dead_letters table only"
				if n := strings.Count(logs, tableOnly); n != map[bool]int{false: 1, true: 0}[c.dlq] {
					t.Errorf("the log says %q %d times, want it once without a dead_letter_topic and never with one:\n%s", tableOnly, n, logs)
				}
				if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = '`+bad+`'`); n != 1 {
					t.Errorf("dead letters of the bad event: %d, want 1", n)
				}
				want := map[bool]int64{false: 0, true: 1}[c.published]
				if n := published(t, schema, bad); n != want {
					t.Errorf("dead letters of the bad event marked published: %d, want %d\n%s", n, want, logs)
				}
			})
		}
	}
}

// published counts the dead letters of event id in schema marked
// published to the dead-letter topic.
func published(t *testing.T, schema, id string) int64 {
	t.Helper()
	return sinktest.Count(t, sinktest.Pool(t), `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = '`+id+`' AND published_at IS NOT NULL`)
}

// A kafka.dead_letter_topic the brokers do not have ends the start, naming
// the key and the topic, and saying how to go on: dead letters would
// otherwise pile up unpublished, warned about for ever.
func TestRunFailsWhenDeadLetterTopicIsMissing(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	for name, start := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			seeds := start(t)
			schema := freshSchema(t, pool, "test_dlq_missing_")
			topic := "payments-" + randomHex(4)
			createTopic(t, seeds, topic, 1)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			root := newRoot()
			root.SetOut(io.Discard)
			root.SetErr(io.Discard)
			root.SetArgs([]string{"run", "--brokers", strings.Join(seeds, ","), "--topics", topic, "--group", "g-" + topic,
				"--dsn", dsn, "--schema", schema, "--http-addr", "127.0.0.1:0", "--log-level", "error"})
			t.Setenv("ONCEFLOW_KAFKA_DEAD_LETTER_TOPIC", topic+".dlq")
			err := root.ExecuteContext(ctx)
			if ctx.Err() != nil {
				t.Fatalf("run went on for 60s instead of failing: %v", err)
			}
			if err == nil || !strings.Contains(err.Error(), "kafka.dead_letter_topic") || !strings.Contains(err.Error(), `"`+topic+`.dlq"`) ||
				!strings.Contains(err.Error(), "does not exist") {
				t.Fatalf("run: %v\nwant an error naming kafka.dead_letter_topic and %q, saying it does not exist", err, topic+".dlq")
			}
			t.Logf("run: %v", err)
		})
	}
}
