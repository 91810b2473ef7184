package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// `onceflow run` whose kafka.brokers names something that is not Kafka —
// PostgreSQL's port, an HTTP server, a service answering bytes of its own
// — ends at once with an error naming kafka.brokers and the address:
// waiting cannot cure it. (A broker that refuses connections is waited
// for: TestRunWaitsForPostgresAndKafka.)
func TestRunFailsWhenBrokersAreNotKafka(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	postgres := net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	httpServer := answering(t, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	// A length-prefixed frame, as Kafka's, whose correlation id is wrong.
	framed := answering(t, "\x00\x00\x00\x08garbage!")

	for _, c := range []struct {
		name    string
		brokers []string
		bad     string // the address the error must name
	}{
		{"postgres", []string{postgres}, postgres},
		{"http", []string{httpServer}, httpServer},
		{"another protocol's frame", []string{framed}, framed},
		{"one seed of two is postgres", []string{kafka.ListenAddrs()[0], postgres}, postgres},
	} {
		t.Run(c.name, func(t *testing.T) {
			schema := freshSchema(t, pool, "test_notkafka_")
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			root := newRoot()
			root.SetOut(io.Discard)
			root.SetErr(io.Discard)
			root.SetArgs([]string{"run", "--brokers", strings.Join(c.brokers, ","), "--topics", "orders", "--group", "notkafka",
				"--dsn", dsn, "--schema", schema, "--http-addr", "127.0.0.1:0", "--log-level", "error"})
			err := root.ExecuteContext(ctx)
			if ctx.Err() != nil {
				t.Fatalf("run waited for 60s instead of failing: %v", err)
			}
			if err == nil || !strings.Contains(err.Error(), "kafka.brokers") || !strings.Contains(err.Error(), c.bad) ||
				!strings.Contains(err.Error(), "does not speak the Kafka protocol") {
				t.Fatalf("run: %v\nwant an error naming kafka.brokers and %s, saying it does not speak the Kafka protocol", err, c.bad)
			}
			t.Logf("run: %v", err)
		})
	}
}

// notKafka tells a peer that answers bytes that are no Kafka response
// from a broker that is down, restarting or slow.
func TestNotKafka(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"postgres", errors.New("invalid large response size 1157627904 > limit 104857600: response exceeds BrokerMaxReadBytes"), true},
		{"negative size", errors.New("invalid negative response size -3"), true},
		{"another response", errors.New("correlation ID mismatch"), true},
		{"too short", fmt.Errorf("read: %w", kbin.ErrNotEnoughData), true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"closed", io.EOF, false},
		{"closed mid-frame", io.ErrUnexpectedEOF, false},
		{"silent", context.DeadlineExceeded, false},
	} {
		if got := notKafka(c.err); got != c.want {
			t.Errorf("%s: notKafka(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// answering listens on a free port and answers every connection with
// reply, once some bytes arrived, then closes it; it stops at the test's
// end. It returns the address.
func answering(t *testing.T, reply string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Read(make([]byte, 512)); err != nil {
					return
				}
				_, _ = io.WriteString(c, reply)
				time.Sleep(100 * time.Millisecond) // the reply is read before the close
			})
		}
	})
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return l.Addr().String()
}
