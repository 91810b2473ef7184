package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// `onceflow run` and `onceflow serve` started while Postgres and the
// broker are both down keep running like a service: /healthz answers at
// once, /readyz answers 503 naming what it waits for (first Postgres,
// without its connection details, then Kafka), onceflow_ready is 0, and
// /readyz answers 200 once both answered — without a restart.
func TestRunWaitsForPostgresAndKafka(t *testing.T) {
	for _, cmd := range []string{"run", "serve"} {
		t.Run(cmd, func(t *testing.T) { waitsForPostgresAndKafka(t, cmd) })
	}
}

func waitsForPostgresAndKafka(t *testing.T, command string) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_wait_")

	pgPort, kafkaPort, httpPort := freePort(t), freePort(t), freePort(t)
	proxyDSN := dsnAt(t, dsn, pgPort)
	httpAddr := "127.0.0.1:" + strconv.Itoa(httpPort)

	// Services stop after run has stopped: closers run last.
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{command, "--brokers", "127.0.0.1:" + strconv.Itoa(kafkaPort), "--topics", "orders",
		"--group", "wait-test", "--dsn", proxyDSN, "--schema", schema, "--http-addr", httpAddr, "--log-level", "error"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s after cancel: %v", command, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop within 30s of cancel", command)
		}
	}()

	// Both down: not ready, waiting for Postgres (the consumer starts
	// after the migrations).
	waitReady(t, done, httpAddr, func(code int, w map[string]string) bool {
		return code == http.StatusServiceUnavailable && w["postgres"] != "" && w["kafka"] != ""
	}, "503 waiting for postgres and kafka")
	_, w, err := readyz(httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	if why := w["postgres"]; !strings.Contains(why, "does not answer") || strings.Contains(why, "user=") || strings.Contains(why, "database=") ||
		strings.Contains(why, strconv.Itoa(pgPort)) {
		t.Errorf("/readyz says postgres: %q; want what is down, without connection details", why)
	}
	if code, body := get(t, "http://"+httpAddr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while waiting: %d %s", code, body)
	}
	if command == "serve" {
		resp, err := http.Post("http://"+httpAddr+"/events-outbox/kafka", "application/json", strings.NewReader(`{"user_id":1,"items":["A"]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "waiting for postgres") {
			t.Errorf("POST /events-outbox/kafka before the tables exist: %d %s; want 503 saying it waits for postgres", resp.StatusCode, body)
		}
	}
	if code, body := get(t, "http://"+httpAddr+"/metrics"); code != http.StatusOK || !strings.Contains(body, `onceflow_ready{check="postgres"} 0`) {
		t.Errorf("/metrics while waiting: %d, onceflow_ready{check=\"postgres\"} 0 not in it", code)
	}
	// It keeps waiting: still running, still not ready, a few seconds on.
	time.Sleep(2 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("%s ended while Postgres was down: %v", command, err)
	default:
	}

	// Postgres comes up: ready for it, still waiting for Kafka.
	closers = append(closers, forward(t, pgPort, dsn))
	waitReady(t, done, httpAddr, func(code int, w map[string]string) bool {
		return code == http.StatusServiceUnavailable && w["postgres"] == "" && w["kafka"] != ""
	}, "503 waiting for kafka only")

	// The broker comes up on the address it was given: ready.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(kafkaPort), kfake.SeedTopics(3, "orders"),
		kfake.SeedTopics(1, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	closers = append(closers, c.Close)
	waitReady(t, done, httpAddr, func(code int, _ map[string]string) bool { return code == http.StatusOK }, "200")
}

// waitReady polls /readyz until ok accepts its status and waiting_for,
// failing after 60s or if run ends.
func waitReady(t *testing.T, done <-chan error, addr string, ok func(int, map[string]string) bool, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for {
		code, w, err := readyz(addr)
		if err == nil && ok(code, w) {
			return
		}
		last = fmt.Sprintf("%d %v %v", code, w, err)
		select {
		case err := <-done:
			t.Fatalf("run ended while waiting for /readyz %s: %v", want, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: want %s within 60s; last: %s", want, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readyz(addr string) (int, map[string]string, error) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body struct {
		WaitingFor map[string]string `json:"waiting_for"`
	}
	if resp.StatusCode != http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return resp.StatusCode, nil, err
		}
	}
	return resp.StatusCode, body.WaitingFor, nil
}

// freePort returns a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// dsnAt is dsn with its host and port replaced by 127.0.0.1:port.
func dsnAt(t *testing.T, dsn string, port int) string {
	t.Helper()
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(pc.User, pc.Password),
		Host: "127.0.0.1:" + strconv.Itoa(port), Path: "/" + pc.Database, RawQuery: "sslmode=disable"}
	return u.String()
}

// forward listens on port and forwards each connection to dsn's Postgres
// until the returned stop, which closes everything and waits.
func forward(t *testing.T, port int, dsn string) (stop func()) {
	t.Helper()
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			track(in)
			track(out)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// get returns the status and body of a GET of url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
