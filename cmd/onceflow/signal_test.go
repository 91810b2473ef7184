package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// buildBinary builds onceflow once per test binary, into a temporary
// directory that outlives every test.
var buildBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "onceflow-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "onceflow")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", &buildError{err, string(out)}
	}
	return bin, nil
})

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + e.out }

// A SIGTERM drains within drain_timeout; a second SIGTERM during the drain
// ends the process at once, without committing the batch in flight (here
// held by a lock on a handler's table): nothing of it is in Postgres, and
// the exit status says the run was aborted (128 + the signal's number).
func TestSecondSignalAbortsTheDrain(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_signal_")
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	stream, err := orders.Generate(200, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	c := ordersCluster(t, 1, stream)

	// Migrate, then hold emails_sent so that the first batch blocks.
	if _, err := runCLI(t, &bytes.Buffer{}, "migrate", "--dsn", dsn, "--schema", schema); err != nil {
		t.Fatal(err)
	}
	lock, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.Background()) }()
	if _, err := lock.Exec(t.Context(), `LOCK TABLE `+schema+`.emails_sent IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	var out syncBuffer
	cmd := exec.Command(bin, "run", "--brokers", c.ListenAddrs()[0], "--topics", "orders", "--group", "signal-test",
		"--dsn", dsn, "--schema", schema, "--http-addr", "127.0.0.1:"+strconv.Itoa(freePort(t)))
	cmd.Env = append(withoutOnceflowEnv(), "ONCEFLOW_DRAIN_TIMEOUT=50s", "ONCEFLOW_KAFKA_REBALANCE_TIMEOUT=60s",
		"ONCEFLOW_POSTGRES_TX_TIMEOUT=2m")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	// The batch is in flight: a backend of the member waits on the lock.
	waitFor(t, 60*time.Second, "a batch waiting on the lock", func() bool {
		var n int
		_ = pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query ILIKE '%emails_sent%'`).Scan(&n)
		return n > 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Fatalf("run ended within 2s of the first SIGTERM (%v), want it draining for up to drain_timeout\n%s", err, out.String())
	case <-time.After(2 * time.Second):
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		// An abort is not a clean stop: a supervisor must see it failed.
		var exit *exec.ExitError
		switch {
		case !errors.As(err, &exit):
			t.Errorf("run after the second SIGTERM: %v, want a non-zero exit status\n%s", err, out.String())
		case exit.ExitCode() != 128+int(syscall.SIGTERM):
			t.Errorf("run exited with status %d after the second SIGTERM, want %d (128 + SIGTERM)\n%s",
				exit.ExitCode(), 128+int(syscall.SIGTERM), out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("run still running 10s after the second SIGTERM\n%s", out.String())
	}
	if !strings.Contains(out.String(), "second signal: aborting") {
		t.Errorf("log does not say the second signal aborted:\n%s", out.String())
	}
	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.processed_events`); n != 0 {
		t.Errorf("processed_events has %d rows after the abort, want 0: the batch in flight must not commit", n)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.sink_offsets WHERE next_offset IS NOT NULL`); n != 0 {
		t.Errorf("sink_offsets has %d stored offsets after the abort, want 0", n)
	}
}

// withoutOnceflowEnv is this process's environment without ONCEFLOW_*
// variables, so a child's configuration is only what the test sets.
func withoutOnceflowEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCEFLOW_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitFor polls cond every 50ms until it holds, failing after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
