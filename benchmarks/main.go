package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// usage is what `go run ./benchmarks` says without an experiment.
const usage = `usage: go run ./benchmarks backlog|retention [flags]   (-h: the experiment's flags)

The scenario benchmark (steady, storm, replay against the effects-only and
raw-copy baselines) is onceflow bench on the demo's configs:

  bin/onceflow bench --config benchmarks/demo.yaml --sample benchmarks/orders.jsonl   (make bench, make bench-full)
`

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "backlog":
			os.Exit(mainBacklog(os.Args[2:]))
		case "retention":
			os.Exit(mainRetention(os.Args[2:]))
		}
	}
	fmt.Fprint(os.Stderr, usage)
	os.Exit(2)
}

// options are the settings the experiments share.
type options struct {
	brokers    string
	dsn        string
	duplicates float64
	partitions int
	handlers   []string
	batch      int // the raw copy's events per transaction
	poolSize   int // the raw copy's connections
	out        string
	seed       uint64
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

// mainBacklog is `benchmarks backlog`: one onceflow run member draining a
// backlog, optionally on pre-filled tables (see the package doc). It
// returns the exit code.
func mainBacklog(args []string) int {
	o, err := parseBacklogFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks backlog:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runBacklog(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks backlog:", err)
		return 1
	}
	return 0
}

// build names the code a run measures: the commit checked out where the
// benchmark runs, "+dirty" when files other than committed results differ
// from it (a run writes its results into the tree); with bin (a prebuilt
// member binary), that binary's path too, whose code may differ.
func build(bin string) string {
	out, err := exec.Command("git", "rev-parse", "--short=7", "HEAD").Output()
	s := strings.TrimSpace(string(out))
	if err != nil || s == "" {
		s = "unknown (not run from a git checkout)"
	} else if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--",
		":(top)", ":(top,exclude)benchmarks/results*").Output(); err != nil || len(bytes.TrimSpace(st)) > 0 {
		s += "+dirty"
	}
	if bin != "" {
		s += "; members run " + bin
	}
	return s
}

func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				model = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
	}
	return fmt.Sprintf("%d cores (%s), %s RAM, %s, %s", runtime.NumCPU(), model, mem, runtime.Version(), "PostgreSQL 15 (local)")
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}
