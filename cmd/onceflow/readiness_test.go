package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// /readyz's postgres reason names what is wrong and no connection detail.
func TestPostgresDownSaysWhatWithoutWhere(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("failed to connect to `user=alice database=orders`: 10.0.0.7:5432 (db.internal): %w", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"refused", wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), "connection refused"},
		{"timeout", wrap(context.DeadlineExceeded), "no answer in time"},
		{"dns", wrap(&net.DNSError{Err: "no such host", Name: "db.internal"}), "host name does not resolve"},
		{"password", wrap(&pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "alice"`}), "refuses the login (SQLSTATE 28P01"},
		{"no database", wrap(&pgconn.PgError{Code: "3D000", Message: `database "orders" does not exist`}), "database does not exist"},
		{"starting", wrap(&pgconn.PgError{Code: "57P03"}), "starting up"},
		{"other", wrap(errors.New("db.internal: something")), "postgres does not answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := postgresDown(tc.err)
			if !strings.Contains(got, tc.want) {
				t.Errorf("postgresDown = %q, want it to say %q", got, tc.want)
			}
			for _, detail := range []string{"alice", "orders", "10.0.0.7", "5432", "db.internal"} {
				if strings.Contains(got, detail) {
					t.Errorf("postgresDown = %q: reveals %q", got, detail)
				}
			}
		})
	}
}

// Two `onceflow run` with one kafka.instance_id under the consumer
// protocol: the second replaces the first, which the broker then refuses
// (another live member holds the id). The refused one owns nothing and
// cannot join, so its /readyz answers 503 naming why and its
// onceflow_ready{check="kafka"} is 0, while the other reads ready.
func TestRunRefusedForItsInstanceIDIsNotReady(t *testing.T) {
	for name, seeds := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			brokers := seeds(t)
			pool := sinktest.Pool(t)
			topic := "orders-" + randomHex(4)
			createTopic(t, brokers, topic, 2)
			createTopic(t, brokers, topic+".dlq", 1)
			start := func(schema string) (addr string, stop func()) {
				addr = freeAddr(t)
				file := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  dead_letter_topic: %s.dlq
  group: %s-group
  group_protocol: consumer
  instance_id: same
postgres:
  dsn: %s
  schema: %s
http:
  addr: %s
log:
  level: error
`, strings.Join(brokers, ","), topic, topic, topic, sinktest.DSN(t), schema, addr))
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() {
					root := newRoot()
					root.SetOut(io.Discard)
					root.SetErr(io.Discard)
					root.SetArgs([]string{"run", "--config", file})
					done <- root.ExecuteContext(ctx)
				}()
				waitReady(t, done, addr, func(code int, _ map[string]string) bool { return code == http.StatusOK }, "200")
				return addr, func() {
					cancel()
					select {
					case err := <-done:
						if err != nil {
							t.Errorf("run after cancel: %v", err)
						}
					case <-time.After(30 * time.Second):
						t.Error("run did not stop within 30s of cancel")
					}
				}
			}
			schema := freshSchema(t, pool, "test_held_")
			first, stopFirst := start(schema)
			defer stopFirst()
			second, stopSecond := start(schema)
			defer stopSecond()

			done := make(chan error) // the first run goes on; waitReady only needs a channel
			waitReady(t, done, first, func(code int, w map[string]string) bool {
				return code == http.StatusServiceUnavailable && strings.Contains(w["kafka"], "holds this member's instance id")
			}, `503 saying another member holds the instance id`)
			_, w, err := readyz(first)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the refused run's /readyz: %v", w)
			if !strings.Contains(w["kafka"], `"same"`) || w["postgres"] != "" {
				t.Errorf("/readyz of the refused run = %v, want kafka naming the instance id \"same\", postgres ready", w)
			}
			if code, body := get(t, "http://"+first+"/metrics"); code != http.StatusOK || !strings.Contains(body, `onceflow_ready{check="kafka"} 0`) {
				t.Errorf("/metrics of the refused run: %d, onceflow_ready{check=\"kafka\"} 0 not in it", code)
			}
			if code, w, err := readyz(second); err != nil || code != http.StatusOK {
				t.Errorf("/readyz of the run holding the instance id: %d %v %v, want 200", code, w, err)
			}
		})
	}
}
