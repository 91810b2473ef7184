package main

import (
	"bytes"
	"os"
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

// The flags behind the project's figures reach the report: --checkpoint,
// --storm-changes, --group-protocol classic,consumer (the runs side by
// side), --cpuprofile, --other-partition; bad values are refused, each
// named, before anything runs.
func TestBenchFigureFlags(t *testing.T) {
	pool := sinktest.Pool(t)
	prefix := freshSchema(t, pool, "test_benchflags_")
	demo := filepath.Join("..", "..", "benchmarks", "demo.yaml")
	sample := filepath.Join("..", "..", "benchmarks", "orders.jsonl")
	var stderr bytes.Buffer
	_, err := runCLI(t, &stderr, "bench", "--config", demo, "--sample", sample, "--dsn", sinktest.DSN(t),
		"--group-protocol", "classic,eager", "--storm-changes", "0", "--other-partition", "-0.5", "--bench-schema", prefix, "--out", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), `--group-protocol "eager"`) || !strings.Contains(err.Error(), "--storm-changes 0") ||
		!strings.Contains(err.Error(), "--other-partition -0.5: a share from 0 to 1") {
		t.Fatalf("bad flags: %v, want the three named", err)
	}
	out, prof := filepath.Join(t.TempDir(), "out"), filepath.Join(t.TempDir(), "cpu.prof")
	_, err = runCLI(t, &stderr, "bench", "--config", demo, "--sample", sample, "--dsn", sinktest.DSN(t),
		"--events", "3000", "--partitions", "4", "--members", "2", "--scenarios", "steady,storm", "--no-raw-copy",
		"--storm-changes", "2", "--storm-every", "100ms", "--group-protocol", "classic,consumer", "--checkpoint",
		"--cpuprofile", prof, "--other-partition", "0", "--bench-schema", prefix, "--out", out)
	if err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
	}
	res, err := bench.ReadResults(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range res.Runs {
		names = append(names, r.Name)
		if !r.ExactlyOnce || !r.FromCheckpoint {
			t.Errorf("%s: exactly once %v, from a checkpoint %v", r.Name, r.ExactlyOnce, r.FromCheckpoint)
		}
		if r.Scenario == bench.Storm && r.StormPlanned != 2 {
			t.Errorf("%s: %d changes planned, want 2", r.Name, r.StormPlanned)
		}
	}
	if got, want := strings.Join(names, ","), "effects-only,steady-classic,storm-classic,steady-consumer,storm-consumer"; got != want {
		t.Errorf("runs %s, want %s", got, want)
	}
	if len(res.Protocols) != 2 || res.Protocols[0].Protocol != "classic" || res.Protocols[1].Protocol != "consumer" {
		t.Errorf("protocols %+v, want classic and consumer side by side", res.Protocols)
	}
	if !res.HasPrice {
		t.Errorf("no price of exactly-once (of steady-classic)")
	}
	if st, err := os.Stat(prof); err != nil || st.Size() == 0 {
		t.Errorf("--cpuprofile: %v", err)
	}
	md, _ := os.ReadFile(filepath.Join(out, "results.md"))
	if !strings.Contains(string(md), "### Group protocols side by side") {
		t.Errorf("results.md lacks the protocols' table:\n%s", md)
	}
	if op := res.Settings.OtherPartition; op == nil || *op != 0 || !strings.Contains(string(md), "30 % redeliveries, each on its event's partition") {
		t.Errorf("--other-partition 0: results.json other_partition %v; results.md:\n%s", op, md)
	}
}

// results.md quotes the command line: a password in --dsn is not in it.
func TestBenchCommandLineRedactsDSN(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--config", "c.yaml", "--dsn", "postgres://u:s3cret@db:5432/x", "--events", "10"},
		{"bench", "--dsn=postgres://u:s3cret@db:5432/x"},
	} {
		got := benchCommandLine(args)
		if strings.Contains(got, "s3cret") || !strings.Contains(got, "db:5432") || !strings.HasPrefix(got, "onceflow bench") {
			t.Errorf("command line %q: want the DSN without its password", got)
		}
	}
}

// --formats runs the demo's scenarios again with the seed's orders in
// Avro and Protobuf (benchmarks/order.avsc, benchmarks/order.proto),
// through a registry in the process when the config names none: every
// run exactly once, each format compared with JSON.
func TestBenchDemoFormats(t *testing.T) {
	pool := sinktest.Pool(t)
	prefix := freshSchema(t, pool, "test_benchfmt_")
	dir := filepath.Join("..", "..", "benchmarks")
	var stderr bytes.Buffer
	_, err := runCLI(t, &stderr, "bench", "--config", filepath.Join(dir, "demo.yaml"), "--sample", filepath.Join(dir, "orders.jsonl"),
		"--dsn", sinktest.DSN(t), "--formats", "avro,xml", "--bench-schema", prefix, "--out", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), `--formats "xml"`) || !strings.Contains(err.Error(), "--formats avro and --avro-schema go together") {
		t.Fatalf("bad --formats: %v, want both problems named", err)
	}
	out := filepath.Join(t.TempDir(), "out")
	_, err = runCLI(t, &stderr, "bench", "--config", filepath.Join(dir, "demo.yaml"), "--sample", filepath.Join(dir, "orders.jsonl"),
		"--dsn", sinktest.DSN(t), "--events", "1000", "--partitions", "3", "--members", "2", "--scenarios", "steady", "--no-raw-copy",
		"--formats", "json,avro,protobuf", "--avro-schema", filepath.Join(dir, "order.avsc"), "--protobuf-schema", filepath.Join(dir, "order.proto"),
		"--bench-schema", prefix, "--out", out)
	if err != nil {
		t.Fatalf("bench --formats: %v\nstderr:\n%s", err, stderr.String())
	}
	res, err := bench.ReadResults(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range res.Runs {
		names = append(names, r.Name)
		if !r.ExactlyOnce {
			t.Errorf("%s: not exactly once: %v", r.Name, r.Problems)
		}
	}
	if got, want := strings.Join(names, ","), "effects-only,steady,steady-avro,steady-protobuf"; got != want {
		t.Errorf("runs %s, want %s", got, want)
	}
	if len(res.Formats) != 2 {
		t.Errorf("format ratios %+v, want avro's and protobuf's", res.Formats)
	}
}
