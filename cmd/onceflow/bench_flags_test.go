package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/bench"
)

// Every bad flag value of bench is listed in one error, each named by
// its flag, before anything runs.
func TestBenchFlagsAllNamed(t *testing.T) {
	_, config := benchUser(t, "127.0.0.1:1", "payments-"+randomHex(4), benchPaymentsSQL)
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"many", []string{"--events", "0", "--duplicates", "5", "--storm-every", "-1s", "--bench-schema", "BAD", "--cpuprofile-of", "zz",
			"--scenarios", "nope", "--pool", "0", "--members", "0"},
			[]string{"no payloads", "--events 0: at least 1", "--duplicates 5: a share from 0 to 1", "--storm-every -1s: not negative",
				`--bench-schema "BAD"`, `--cpuprofile-of "zz"`, `--scenarios "nope"`, "--pool 0: at least 1", "--members 0: at least 1"}},
		{"empty scenarios", []string{"--sample", "x.jsonl", "--scenarios", ""}, []string{"--scenarios: none given"}},
		{"no config", []string{"--config", "", "--sample", "x.jsonl"}, []string{"no --config: bench measures a config's handlers"}},
		{"values that would crash or hang", []string{"--duplicates", "NaN", "--partitions", "100000", "--bench-schema", "pg_x"},
			[]string{"--duplicates NaN: a share from 0 to 1", "--partitions 100000: at most 1000", `--bench-schema "pg_x"`, "not pg_"}},
		{"a stream too big to hold", []string{"--events", "1000000000000"},
			[]string{"--events 1000000000000: with --duplicates 0.3, 1300000000000 records: at most 10000000 records"}},
		{"more baseline writers than the config's pool, and no sample", []string{"--sample", "x.jsonl", "--baseline-writers", "64"},
			[]string{"--baseline-writers 64: at most one writer per connection of the pool", "postgres.pool_size", "leave it out to measure the fastest",
				"--sample: open x.jsonl"}},
		{"more baseline writers than --pool, and no sample", []string{"--sample", "x.jsonl", "--baseline-writers", "9", "--pool", "2"},
			[]string{"--baseline-writers 9: at most one writer per connection of the pool (2, --pool)", "--sample: open x.jsonl"}},
		{"a bad range, too many baseline writers and no sample", []string{"--sample", "x.jsonl", "--duplicates", "5", "--baseline-writers", "64"},
			[]string{"--duplicates 5: a share from 0 to 1", "--baseline-writers 64: at most one writer", "--sample: open x.jsonl"}},
		{"no pool and no sample", []string{"--sample", "x.jsonl", "--pool", "0", "--baseline-writers", "0"},
			[]string{"--pool 0: at least 1", "--baseline-writers 0: at least 1", "--sample: open x.jsonl"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			stdout, err := runCLI(t, &stderr, append([]string{"bench", "--config", config, "--out", t.TempDir()}, tt.args...)...)
			if err == nil {
				t.Fatalf("bench %v ran:\n%s", tt.args, stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error:\n%v\nwant it to say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "0 measures") {
				t.Errorf("error offers 0, which the flag refuses:\n%v", err)
			}
			for _, field := range []string{"Duplicates", "StormEvery", "CPUProfileOf", "Schema ", "PoolSize", "Events", "bench: "} {
				if strings.Contains(err.Error(), field) {
					t.Errorf("error names %q, not a flag:\n%v", field, err)
				}
			}
		})
	}
}

// --out and --compare are checked before anything runs: a file as --out
// and a --compare that is not a results.json are refused at once; and
// --compare DIR/results.json with --out DIR compares with the earlier
// run, read before this one overwrites it.
func TestBenchOutAndCompareAtStart(t *testing.T) {
	schema, config := benchUser(t, "127.0.0.1:1", "payments-"+randomHex(4), benchPaymentsSQL)
	tmpl := filepath.Join(t.TempDir(), "payment.json")
	if err := os.WriteFile(tmpl, []byte(`{"account": "acct-{{int 1 50}}", "amount": "{{decimal 0.01 999.99 2}}"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"bench", "--config", config, "--template", tmpl, "--events", "300", "--partitions", "3", "--members", "2",
		"--bench-schema", schema + "_b", "--scenarios", "steady", "--no-raw-copy"}
	file := filepath.Join(t.TempDir(), "afile")
	notResults := filepath.Join(t.TempDir(), "other.json")
	for _, f := range []string{file, notResults} {
		if err := os.WriteFile(f, []byte(`{"name": "something else"}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"out is a file", []string{"--out", file}, "--out " + file + ": not a directory"},
		{"compare is not a results.json", []string{"--out", t.TempDir(), "--compare", notResults}, "not a results.json"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			stdout, err := runCLI(t, &stderr, append(common, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if strings.Contains(stderr.String(), "effects-only") || stdout != "" {
				t.Fatalf("the benchmark ran before the refusal:\n%s\n%s", stderr.String(), stdout)
			}
		})
	}
	out := t.TempDir()
	var stderr bytes.Buffer
	if _, err := runCLI(t, &stderr, append(common, "--out", out)...); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	old, err := bench.ReadResults(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := runCLI(t, &stderr, append(common, "--out", out, "--compare", filepath.Join(out, "results.json"))...)
	if err != nil {
		t.Fatalf("bench --compare: %v\n%s", err, stderr.String())
	}
	_, cmp, _ := strings.Cut(stdout, "compared with")
	for _, l := range old.Summary {
		if want := fmt.Sprintf("%s  %12.0f", l.Name, l.EventsPerSec); !strings.Contains(squeeze(cmp), squeeze(want)) {
			t.Errorf("compare lacks the earlier %s rate %.0f:\n%s", l.Name, l.EventsPerSec, cmp)
		}
	}
}

// squeeze makes runs of spaces one.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }

// On a real Kafka the stream is on a topic of bench's own, but the
// handlers see the config's topic, as they do on the embedded cluster: a
// handler that filters on events.topic writes every event.
func TestBenchHandlersSeeTheConfigsTopic(t *testing.T) {
	addrs := os.Getenv(envKafka)
	if addrs == "" {
		if os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "" {
			t.Fatalf("%s is not set and CI is: this test needs a real Kafka (infra/kafka.sh start)", envKafka)
		}
		t.Skipf("%s not set", envKafka)
	}
	topic := "payments-" + randomHex(4)
	schema, config := benchUser(t, addrs, topic, benchPaymentsSQL+"\nWHERE topic = '"+topic+"'")
	tmpl := filepath.Join(t.TempDir(), "payment.json")
	if err := os.WriteFile(tmpl, []byte(`{"account": "acct-{{int 1 50}}", "amount": "{{decimal 0.01 999.99 2}}"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	var stderr bytes.Buffer
	if _, err := runCLI(t, &stderr, "bench", "--config", config, "--template", tmpl, "--events", "300", "--partitions", "3", "--members", "2",
		"--bench-schema", schema+"_b", "--scenarios", "steady", "--no-raw-copy", "--brokers", "--out", out); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	res, err := bench.ReadResults(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Runs {
		if n := r.Tables["payments"].Rows; n != 300 {
			t.Errorf("%s: the handler filtering on topic = '%s' wrote %d rows, want the 300 events", r.Name, topic, n)
		}
	}
}

// cancelOn is a writer that cancels when what it was written contains s.
type cancelOn struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	s      string
	cancel context.CancelFunc
}

func (w *cancelOn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.s) {
		w.cancel()
	}
	return len(p), nil
}

func (w *cancelOn) String() string { w.mu.Lock(); defer w.mu.Unlock(); return w.buf.String() }

// A bench interrupted (SIGINT: its context ends) says it was
// interrupted, and with --keep which schemas it kept, the interrupted
// run's included.
func TestBenchInterrupted(t *testing.T) {
	schema, config := benchUser(t, "127.0.0.1:1", "payments-"+randomHex(4), `WITH pace AS (SELECT pg_sleep(0.05))
INSERT INTO payments (event_id, account, amount, paid_at)
SELECT event_id, payload->>'account', (payload->>'amount')::numeric, "timestamp" FROM events, pace`)
	tmpl := filepath.Join(t.TempDir(), "payment.json")
	if err := os.WriteFile(tmpl, []byte(`{"account": "acct-{{int 1 50}}", "amount": "{{decimal 0.01 999.99 2}}"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stderr := &cancelOn{s: "steady (round 1): ", cancel: cancel}
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(stderr)
	root.SetArgs([]string{"bench", "--config", config, "--template", tmpl, "--events", "5000", "--partitions", "3", "--members", "2",
		"--bench-schema", schema + "_b", "--scenarios", "steady", "--no-raw-copy", "--keep", "--out", t.TempDir(),
		"--pool", "2", "--batch-max-records", "50"}) // paced batches of 50: the steady run lasts two seconds at least
	err := root.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "interrupted") || strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("bench interrupted: %v, want it to say interrupted (not context canceled)\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "steady (round 1): interrupted") {
		t.Errorf("progress lacks the interrupted run:\n%s", stderr.String())
	}
	all := stderr.String() + out.String()
	for _, run := range []string{"effects_only_r1, ", "effects_only_r1_t", "steady_r1, ", "steady_r1_t"} { // each run's and its clones'
		if !strings.Contains(all, "kept schemas: ") || !strings.Contains(all, run) {
			t.Errorf("output lacks the kept schema of %s:\n%s", run, all)
		}
	}
}

// A run that writes nothing to --out removes the directories it made for
// it, refused before or after the config is read; a directory that was
// there stays.
func TestBenchRefusedLeavesNoOut(t *testing.T) {
	_, config := benchUser(t, "127.0.0.1:1", "payments-"+randomHex(4), benchPaymentsSQL)
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"bad flag", []string{"--sample", "x.jsonl", "--events", "0"}},
		{"missing sample", []string{"--sample", filepath.Join(t.TempDir(), "none.jsonl")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			top := t.TempDir()
			there := filepath.Join(top, "there")
			if err := os.Mkdir(there, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, out := range []string{filepath.Join(top, "a", "b"), there} {
				var stderr bytes.Buffer
				if _, err := runCLI(t, &stderr, append([]string{"bench", "--config", config, "--out", out}, tt.args...)...); err == nil {
					t.Fatal("bench ran")
				}
			}
			if _, err := os.Stat(filepath.Join(top, "a")); !os.IsNotExist(err) {
				t.Errorf("%s/a left (%v)", top, err)
			}
			if _, err := os.Stat(there); err != nil {
				t.Errorf("the --out that was there: %v", err)
			}
		})
	}
}
