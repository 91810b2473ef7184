package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// TestMain checks that no goroutine outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example builds, runs against the test database, says every effect
// happened exactly once, and the tables agree — also when its DSN sets the
// exec or simple_protocol query mode, as behind a transaction pooler.
func TestExampleRuns(t *testing.T) {
	pool := sinktest.Pool(t)
	bin := filepath.Join(t.TempDir(), "customhandler")
	if out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, mode := range []string{"", "exec", "simple_protocol"} {
		name := mode
		if name == "" {
			name = "dsn"
		}
		t.Run(name, func(t *testing.T) {
			dsn := sinktest.DSN(t)
			if mode != "" {
				dsn = sinktest.ModeDSN(t, mode)
			}
			runExample(t, bin, dsn, pool)
		})
	}
}

// runExample runs the example built at bin against dsn, in a fresh schema,
// and checks its output and tables through pool.
func runExample(t *testing.T, bin, dsn string, pool *pgxpool.Pool) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "test_example_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), bin, "-dsn", dsn, "-schema", schema, "-payments", "600", "-timeout", "90s")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the example failed: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	for _, want := range []string{"member 1 stopped (drained)", "by the LRU", "member 2 stopped (drained)",
		"600 rows for 600 distinct payments", "exactly once: yes"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output does not say %q:\n%s", want, &stdout)
		}
	}
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+ledger); n != 600 {
		t.Errorf("ledger holds %d rows, want 600", n)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) - count(DISTINCT event_id) FROM `+ledger); n != 0 {
		t.Errorf("%d payments booked more than once", n)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()); n < 1 {
		t.Error("no dead letter for the bad payment")
	}
}
