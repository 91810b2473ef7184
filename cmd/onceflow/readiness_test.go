package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
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

// Two `onceflow run` with one kafka.instance_id. Under the consumer
// protocol the second replaces the first, which the broker then refuses
// (another live member holds the id): the refused one owns nothing and
// cannot join, so its /readyz answers 503 naming why and its
// onceflow_ready{check="kafka"} is 0, while the other reads ready. Under
// the classic protocol the first is fenced and its run ends with an error
// naming kafka.instance_id (it has no /readyz any more).
func TestRunRefusedForItsInstanceIDIsNotReady(t *testing.T) {
	for name, seeds := range testBrokers(t) {
		for _, protocol := range []string{"consumer", "classic"} {
			t.Run(name+"/"+protocol, func(t *testing.T) { refusedForInstanceID(t, seeds(t), protocol) })
		}
	}
}

func refusedForInstanceID(t *testing.T, brokers []string, protocol string) {
	pool := sinktest.Pool(t)
	topic := "orders-" + randomHex(4)
	createTopic(t, brokers, topic, 2)
	createTopic(t, brokers, topic+".dlq", 1)
	type run struct {
		addr string
		done chan error
		stop func()
	}
	start := func(schema string) run {
		r := run{addr: freeAddr(t), done: make(chan error, 1)}
		file := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  dead_letter_topic: %s.dlq
  group: %s-group
  group_protocol: %s
  instance_id: same
postgres:
  dsn: %s
  schema: %s
http:
  addr: %s
log:
  level: error
`, strings.Join(brokers, ","), topic, topic, topic, protocol, sinktest.DSN(t), schema, r.addr))
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			root := newRoot()
			root.SetOut(io.Discard)
			root.SetErr(io.Discard)
			root.SetArgs([]string{"run", "--config", file})
			r.done <- root.ExecuteContext(ctx)
		}()
		waitReady(t, r.done, r.addr, func(code int, _ map[string]string) bool { return code == http.StatusOK }, "200")
		var once sync.Once
		r.stop = func() {
			once.Do(func() {
				cancel()
				select {
				case err := <-r.done:
					if err != nil {
						t.Errorf("run after cancel: %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Error("run did not stop within 30s of cancel")
				}
			})
		}
		return r
	}
	schema := freshSchema(t, pool, "test_held_")
	first := start(schema)
	defer first.stop()
	second := start(schema)
	defer second.stop()

	if protocol == "classic" {
		select {
		case err := <-first.done:
			first.done <- nil // ended: the deferred stop finds it so
			if err == nil || !strings.Contains(err.Error(), "kafka.instance_id") {
				t.Errorf("the fenced run ended with %v, want an error naming kafka.instance_id", err)
			}
			t.Logf("the fenced run: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("the fenced run did not end")
		}
	} else {
		waitReady(t, make(chan error), first.addr, func(code int, w map[string]string) bool {
			return code == http.StatusServiceUnavailable && strings.Contains(w["kafka"], "holds this member's instance id")
		}, `503 saying another member holds the instance id`)
		_, w, err := readyz(first.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the refused run's /readyz: %v", w)
		if !strings.Contains(w["kafka"], `"same"`) || w["postgres"] != "" {
			t.Errorf("/readyz of the refused run = %v, want kafka naming the instance id \"same\", postgres ready", w)
		}
		if code, body := get(t, "http://"+first.addr+"/metrics"); code != http.StatusOK || !strings.Contains(body, `onceflow_ready{check="kafka"} 0`) {
			t.Errorf("/metrics of the refused run: %d, onceflow_ready{check=\"kafka\"} 0 not in it", code)
		}
	}
	if code, w, err := readyz(second.addr); err != nil || code != http.StatusOK {
		t.Errorf("/readyz of the run holding the instance id: %d %v %v, want 200", code, w, err)
	}
}

// A pool whose every connection a batch holds (long transactions on a slow
// link, a busy member) is ready while batches keep ending: a ping would
// queue behind them and time out though Postgres answers. Once none ended
// within the transaction timeout, the ping decides.
func TestPostgresCheckOfABusyPool(t *testing.T) {
	pool := sinktest.SizedPool(t, 1)
	const txTimeout = time.Second
	check := postgresCheck(pool, txTimeout)
	ready := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		return check.Ready(ctx)
	}
	if err := ready(); err != nil {
		t.Fatalf("an idle pool: %v", err)
	}
	conn, err := pool.Acquire(t.Context()) // a batch's transaction
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := ready(); err != nil {
			t.Errorf("every connection busy, a batch begun within the transaction timeout: %v", err)
		}
	}
	time.Sleep(txTimeout)
	if err := ready(); err == nil || !strings.Contains(err.Error(), "none ended for 1s") {
		t.Errorf("every connection busy, none taken for the transaction timeout: %v, want the ping's timeout naming it", err)
	}
	conn.Release() // the batch ended, the next begins
	if conn, err = pool.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := ready(); err != nil {
		t.Errorf("every connection busy, batches ending: %v", err)
	}
}
