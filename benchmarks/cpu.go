package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CPUSplit is the CPU time used during a run (-spans), by process group,
// in seconds (user + system).
type CPUSplit struct {
	// Bench is this process: the members, the harness and, when
	// embedded, kfake.
	Bench float64 `json:"bench_s"`
	// Backends are the Postgres backends of the run's pool.
	Backends float64 `json:"postgres_backends_s"`
	// PostgresBackground is the server's processes that serve no client
	// (walwriter, checkpointer, background writer, autovacuum workers
	// alive at both ends of the run): shared with everyone else's load.
	PostgresBackground float64 `json:"postgres_background_s"`
	// Broker is the process -broker-pid names; 0 when unset.
	Broker float64 `json:"broker_s"`
	// MachineBusy is every core's non-idle time, whoever used it, and
	// MachineCores × Seconds what there was.
	MachineBusy  float64 `json:"machine_busy_s"`
	MachineCores int     `json:"machine_cores"`
	Seconds      float64 `json:"seconds"`
}

// cpuSnap is the cumulative CPU ticks of each group at one moment.
type cpuSnap struct {
	at                       time.Time
	bench                    float64 // seconds, from getrusage
	backends, bg, broker     map[int]float64
	machineBusy              float64
	machineCores             int
	backendPIDs, postmasters []int
}

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// procCPU returns a process's user + system time in seconds, from
// /proc/<pid>/stat; ok is false when it is gone.
func procCPU(pid int) (float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command is in parentheses and may hold spaces: fields count
	// from the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / clockTicks, true
}

func procPPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

// backgroundPIDs returns the children of postmaster that serve no client:
// their title has no "host(port)" or "[local]".
func backgroundPIDs(postmaster int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || procPPID(pid) != postmaster {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !strings.Contains(string(cmd), "(") && !strings.Contains(string(cmd), "[local]") {
			out = append(out, pid)
		}
	}
	return out
}

// runBackends returns the pids of the backends whose application_name is
// app, and their postmaster.
func runBackends(ctx context.Context, pool *pgxpool.Pool, app string) ([]int, int, error) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil, 0, fmt.Errorf("list the run's backends: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, 0, fmt.Errorf("list the run's backends: %w", err)
	}
	var out []int
	pm := 0
	for _, p := range pids {
		out = append(out, int(p))
		pm = procPPID(int(p))
	}
	return out, pm, nil
}

func machineBusy() (float64, int) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	lines := strings.Split(string(b), "\n")
	cores := 0
	var busy float64
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if f[0] != "cpu" {
			if strings.HasPrefix(f[0], "cpu") {
				cores++
			}
			continue
		}
		for i, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			if i != 3 && i != 4 { // idle, iowait
				busy += x
			}
		}
	}
	return busy / clockTicks, cores
}

func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// snapCPU reads every group's CPU time now. backends are the run's
// backend pids (they must be alive at both snapshots to count).
func snapCPU(backends []int, postmaster, broker int) cpuSnap {
	s := cpuSnap{at: time.Now(), bench: selfCPU(), backends: map[int]float64{}, bg: map[int]float64{}, broker: map[int]float64{}}
	for _, p := range backends {
		if v, ok := procCPU(p); ok {
			s.backends[p] = v
		}
	}
	if postmaster > 0 {
		for _, p := range append(backgroundPIDs(postmaster), postmaster) {
			if v, ok := procCPU(p); ok {
				s.bg[p] = v
			}
		}
	}
	if broker > 0 {
		if v, ok := procCPU(broker); ok {
			s.broker[broker] = v
		}
	}
	s.machineBusy, s.machineCores = machineBusy()
	return s
}

// cpuSplit is the CPU used between two snapshots; a process counts only
// if it is in both.
func cpuSplit(a, b cpuSnap) *CPUSplit {
	diff := func(x, y map[int]float64) float64 {
		var d float64
		for p, v := range y {
			if u, ok := x[p]; ok {
				d += v - u
			}
		}
		return d
	}
	return &CPUSplit{
		Bench: b.bench - a.bench, Backends: diff(a.backends, b.backends), PostgresBackground: diff(a.bg, b.bg),
		Broker: diff(a.broker, b.broker), MachineBusy: b.machineBusy - a.machineBusy, MachineCores: b.machineCores,
		Seconds: b.at.Sub(a.at).Seconds(),
	}
}
