package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// benchSchemas are the schemas whose names start with prefix.
func benchSchemas(t *testing.T, prefix string) []string {
	t.Helper()
	rows, err := sinktest.Pool(t).Query(t.Context(), `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1) ORDER BY 1`, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// startBench starts the onceflow binary's bench with args, its stdout and
// stderr on one pipe, and returns once a run's schema exists (its
// first progress line); the reader is the pipe's end.
func startBench(t *testing.T, args ...string) (*exec.Cmd, *os.File) {
	t.Helper()
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"bench"}, args...)...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); r.Close() })
	sc := bufio.NewScanner(r)
	var seen []string
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.Contains(sc.Text(), "effects-only (round 1): ") {
			return cmd, r
		}
	}
	t.Fatalf("bench ended before its first run:\n%s", strings.Join(seen, "\n"))
	return nil, nil
}

// A killed run (SIGKILL) leaves its schemas; the next run says so, and
// --drop-leftovers alone drops exactly them. A run whose output pipe is
// closed (bench ... | head) drops its own, as Ctrl-C does.
func TestBenchKilledLeavesWhatTheNextRunDrops(t *testing.T) {
	schema, config := benchUser(t, "127.0.0.1:1", "payments-"+randomHex(4), benchPaymentsSQL)
	tmpl := filepath.Join(t.TempDir(), "payment.json")
	if err := os.WriteFile(tmpl, []byte(`{"account": "acct-{{int 1 50}}", "amount": "{{decimal 0.01 999.99 2}}"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	prefix := schema + "_b"
	// One baseline writer: no timing of the writers before the rounds, whose
	// short-lived schemas would come before the run's.
	args := []string{"--config", config, "--template", tmpl, "--events", "200000", "--partitions", "3", "--members", "2",
		"--bench-schema", prefix, "--scenarios", "steady", "--no-raw-copy", "--baseline-writers", "1", "--out", t.TempDir()}

	t.Run("SIGPIPE", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		cmd, r := startBench(t, append(slices.Clone(args), "--out", out)...)
		r.Close() // as head does once it has its lines
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("bench: %v; want it interrupted", err)
		}
		if left := benchSchemas(t, prefix+"_"); len(left) > 0 {
			t.Errorf("a run whose output was closed left %v", left)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("the interrupted run left its --out %s (%v)", out, err)
		}
	})

	cmd, _ := startBench(t, args...)
	left := benchSchemas(t, prefix+"_")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var runs []string // the run's schemas, not its marker
	for _, s := range left {
		if !strings.HasSuffix(s, "_run") {
			runs = append(runs, s)
		}
	}
	if len(runs) != 2 {
		t.Fatalf("schemas of the killed run: %v, want a run's and its clones'", left)
	}
	// The server ends the killed run's session, and so its lock, once it
	// sees the connection closed: wait for that, as a user's next run
	// would come later.
	id := strings.SplitN(strings.TrimPrefix(runs[0], prefix+"_"), "_", 2)[0]
	for held := true; held; time.Sleep(10 * time.Millisecond) {
		if err := sinktest.Pool(t).QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
AND (classid::bigint << 32 | objid::bigint) = hashtextextended('onceflow bench run ' || $1, 0))`, id).Scan(&held); err != nil {
			t.Fatal(err)
		}
	}
	var stderr bytes.Buffer
	stdout, err := runCLI(t, &stderr, "bench", "--config", config, "--bench-schema", prefix, "--drop-leftovers")
	if err != nil {
		t.Fatalf("bench --drop-leftovers: %v\n%s", err, stderr.String())
	}
	for _, s := range runs {
		if !strings.Contains(stdout, s) {
			t.Errorf("bench --drop-leftovers said:\n%s\nwant it to name %s", stdout, s)
		}
	}
	if left := benchSchemas(t, prefix+"_"); len(left) > 0 {
		t.Errorf("after --drop-leftovers: %v left", left)
	}
}

// brokenPipe fails every write, as a closed pipe does.
type brokenPipe struct{}

func (brokenPipe) Write([]byte) (int, error) { return 0, syscall.EPIPE }

// A stdout closed before the run ends (bench ... | head) fails the
// table, not the results: --out gets them.
func TestBenchClosedStdoutStillWritesOut(t *testing.T) {
	schema, config := benchUser(t, "127.0.0.1:1", "payments-"+randomHex(4), benchPaymentsSQL)
	tmpl := filepath.Join(t.TempDir(), "payment.json")
	if err := os.WriteFile(tmpl, []byte(`{"account": "acct-{{int 1 50}}", "amount": "{{decimal 0.01 999.99 2}}"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	root := newRoot()
	var stderr bytes.Buffer
	root.SetOut(brokenPipe{})
	root.SetErr(&stderr)
	root.SetArgs([]string{"bench", "--config", config, "--template", tmpl, "--events", "300", "--partitions", "3", "--members", "2",
		"--bench-schema", schema + "_b", "--scenarios", "steady", "--no-raw-copy", "--out", out})
	if err := root.ExecuteContext(t.Context()); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("bench with a closed stdout: %v, want EPIPE\n%s", err, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(out, "results.json")); err != nil {
		t.Errorf("results.json: %v", err)
	}
}
