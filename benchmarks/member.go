package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// memberProc is one `onceflow run` process: the built binary, configured
// by its environment, its output in a log file. Its owner calls stop on
// every path once start succeeded.
type memberProc struct {
	cmd     *exec.Cmd
	pid     int
	addr    string // its http.addr
	logPath string
	exited  chan struct{} // closed when it exited
	err     error         // its exit, once exited is closed
}

// buildBinary compiles ./cmd/onceflow into dir, unless bin names a binary.
func buildBinary(ctx context.Context, dir, bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	out, err := filepath.Abs(filepath.Join(dir, "onceflow"))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/onceflow")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/onceflow (run from the module root): %w\n%s", err, b)
	}
	return out, nil
}

// startMember starts bin run with env (KEY=VALUE) on top of the
// harness's environment without its ONCEFLOW_* and OTEL_* variables;
// extra comes last and wins.
func startMember(bin, logPath string, env, extra []string) (*memberProc, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	var full []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCEFLOW_") && !strings.HasPrefix(kv, "OTEL_") {
			full = append(full, kv)
		}
	}
	full = append(full, env...)
	full = append(full, "ONCEFLOW_HTTP_ADDR="+addr)
	full = append(full, extra...)
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run")
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, full
	// Killed should the harness die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s run: %w", bin, err)
	}
	m := &memberProc{cmd: cmd, pid: cmd.Process.Pid, addr: addr, logPath: logPath, exited: make(chan struct{})}
	go func() {
		m.err = cmd.Wait()
		f.Close()
		close(m.exited)
	}()
	return m, nil
}

// status returns one field of the member's /proc status in MiB (VmRSS,
// VmHWM), or 0 once it has exited.
func (m *memberProc) status(field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.pid))
	if err != nil {
		return 0
	}
	kb, _ := procStatusKiB(string(b), field)
	return float64(kb) / 1024
}

// counters reads the member's applied and consumed counters from its
// /metrics; ok is false while it does not answer yet.
func (m *memberProc) counters(ctx context.Context) (applied, consumed int64, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.addr+"/metrics", nil)
	if err != nil {
		return 0, 0, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, false
	}
	defer resp.Body.Close()
	c, err := promCounters(resp.Body, "onceflow_events_applied_total", "onceflow_records_consumed_total")
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, 0, false
	}
	return int64(c["onceflow_events_applied_total"]), int64(c["onceflow_records_consumed_total"]), true
}

// stop sends SIGTERM (the member drains and leaves the group) and waits
// up to a minute, then kills it. It returns the member's exit error,
// nil for a clean exit.
func (m *memberProc) stop() error {
	select {
	case <-m.exited:
		return m.err
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
		return m.err
	case <-time.After(time.Minute):
		_ = m.cmd.Process.Kill()
		<-m.exited
		return fmt.Errorf("member pid %d still running a minute after SIGTERM: killed", m.pid)
	}
}

// logTail is the end of the member's log, for errors.
func (m *memberProc) logTail() string {
	b, _ := os.ReadFile(m.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
