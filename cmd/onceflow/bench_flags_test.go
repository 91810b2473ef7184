package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
