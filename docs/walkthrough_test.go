package docs_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The addresses the Avro walkthrough names: this machine's services, as
// infra/ starts them.
const (
	walkPostgres = "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow?sslmode=disable"
	walkKafka    = "127.0.0.1:19092"
	walkRegistry = "http://127.0.0.1:18081/apis/ccompat/v7"
)

// TestAvroWalkthroughRuns runs the shell block of docs/walkthroughs.md's
// Avro walkthrough as written, from the repository's root, on a fresh
// start (its table, onceflow's schema, its topic and group dropped), and
// checks that the output says what the page's comments say: each payment
// once, the unframed one a dead letter with the reason shown.
func TestAvroWalkthroughRuns(t *testing.T) {
	env := map[string]string{"ONCEFLOW_TEST_POSTGRES_DSN": walkPostgres, "ONCEFLOW_TEST_KAFKA_BROKERS": walkKafka,
		"ONCEFLOW_TEST_SCHEMA_REGISTRY": walkRegistry}
	for k, want := range env {
		if got := os.Getenv(k); got != want {
			if os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "" {
				t.Fatalf("%s is %q, not %q: the walkthrough runs on the services infra/ starts", k, got, want)
			}
			t.Skipf("%s is %q, not the walkthrough's %q", k, got, want)
		}
	}
	page := read(t, "docs/walkthroughs.md")
	_, section, ok := strings.Cut(page, "## Avro payments through a schema registry")
	if !ok {
		t.Fatal("docs/walkthroughs.md has no Avro walkthrough")
	}
	_, block, _ := strings.Cut(section, "```sh\n")
	block, _, _ = strings.Cut(block, "```")

	ctx := t.Context()
	conn, err := pgx.Connect(ctx, walkPostgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS avro_payments; DROP SCHEMA IF EXISTS avro_sink CASCADE`); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(walkKafka))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, _ = adm.DeleteGroups(actx, "avro-payments-sink")
	_, _ = adm.DeleteTopics(actx, "avro-payments")
	cancel()
	cl.Close()
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) { // the broker deletes a topic in the background
		cl, _ := kgo.NewClient(kgo.SeedBrokers(walkKafka))
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ts, err := kadm.NewClient(cl).ListTopics(actx)
		cancel()
		cl.Close()
		if err == nil && !ts.Has("avro-payments") {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("topic avro-payments is still there 30s after its deletion")
		}
	}

	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"payment.avsc", "avro-payments.yaml", "avro-run.log"}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			t.Fatalf("%s is in the repository's root: the walkthrough would overwrite it", f)
		}
	}
	t.Cleanup(func() {
		for _, f := range files {
			os.Remove(filepath.Join(root, f))
		}
	})
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", block)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(root, "avro-run.log"))
		t.Fatalf("the walkthrough failed: %v\n%s\nrun's log:\n%s", err, out, log)
	}

	// Each "# …" line after the psql query is a row it prints; the
	// reason in the audit's comment is in the audit's output.
	got := squeeze(string(out))
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		if row, ok := strings.CutPrefix(line, "#  acct-"); ok && !strings.Contains(got, squeeze("acct-"+row)) {
			t.Errorf("the output has no row %q:\n%s", "acct-"+row, out)
		}
	}
	m := regexp.MustCompile(`"reason": "([^"]+)"`).FindStringSubmatch(block)
	if m == nil {
		t.Fatal("the walkthrough shows no dead letter's reason")
	}
	if !strings.Contains(string(out), m[0]) {
		t.Errorf("the audit does not say %s:\n%s", m[0], out)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM avro_payments`).Scan(&n); err != nil || n != 2 {
		t.Errorf("avro_payments holds %d rows (%v), want 2: each good payment once", n, err)
	}
}

// squeeze collapses runs of spaces, as psql aligns its columns.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }
