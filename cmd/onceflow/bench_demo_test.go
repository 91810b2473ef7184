package main

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/bench"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// The project's own benchmark is `onceflow bench` on the demo's configs:
// benchmarks/demo.yaml (emailHandler) and benchmarks/demo-4handlers.yaml
// (the seed's four), over the seed's orders of benchmarks/orders.jsonl.
// Each runs, every order applies, and every run is exactly once.
func TestBenchDemoConfigs(t *testing.T) {
	for _, c := range []struct {
		config   string
		handlers []string
	}{
		{"demo.yaml", []string{"emailHandler"}},
		{"demo-4handlers.yaml", []string{"emailHandler", "inventoryHandler", "analyticsHandler", "recommenderHandler"}},
	} {
		t.Run(c.config, func(t *testing.T) {
			pool := sinktest.Pool(t)
			prefix := freshSchema(t, pool, "test_benchdemo_")
			out := filepath.Join(t.TempDir(), "out")
			var stderr bytes.Buffer
			stdout, err := runCLI(t, &stderr, "bench", "--config", filepath.Join("..", "..", "benchmarks", c.config),
				"--sample", filepath.Join("..", "..", "benchmarks", "orders.jsonl"), "--dsn", sinktest.DSN(t),
				"--events", "1500", "--partitions", "3", "--members", "2", "--scenarios", "steady", "--bench-schema", prefix, "--out", out)
			if err != nil {
				t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
			}
			res, err := bench.ReadResults(filepath.Join(out, "results.json"))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Settings.Handlers, c.handlers) {
				t.Fatalf("handlers %v, want %v", res.Settings.Handlers, c.handlers)
			}
			if got := len(res.Runs); got != 3 {
				t.Fatalf("%d runs, want effects-only, raw-copy and steady:\n%s", got, stdout)
			}
			for _, r := range res.Runs {
				if !r.ExactlyOnce || r.Events != 1500 {
					t.Fatalf("%s: exactly once %v, %d events (want 1500): %v", r.Name, r.ExactlyOnce, r.Events, r.Problems)
				}
			}
			if !strings.Contains(res.Settings.Payloads, "orders.jsonl (1000 lines)") {
				t.Fatalf("payloads %q, want the sample of the seed's orders", res.Settings.Payloads)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, prefix+"%"); n != 0 {
				t.Fatalf("%d bench schemas left", n)
			}
		})
	}
}
