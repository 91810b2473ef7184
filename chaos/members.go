package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// memberConfig is what every member's configuration file says; only the
// client id, the application name and the HTTP address differ.
type memberConfig struct {
	Brokers        []string
	Topic, DLQ     string
	Group          string
	GroupProtocol  string // classic | consumer
	SessionTimeout time.Duration
	BatchRecords   int
	MaxRecordBytes int
	DSN            string // through the proxy
	Schema         string
	PoolSize       int
	TxTimeout      time.Duration
}

// yaml renders the configuration file of member name (see
// config.example.yaml for the keys).
func (c memberConfig) yaml(name string, port int) string {
	dsn := c.DSN + "&application_name=" + appPrefix + name
	if !strings.Contains(c.DSN, "?") {
		dsn = c.DSN + "?application_name=" + appPrefix + name
	}
	return fmt.Sprintf(`# onceflow run configuration of chaos member %[1]s (written by chaos)
kafka:
  brokers: [%[2]s]
  topics: [%[3]s]
  group: %[4]s
  group_protocol: %[17]s
  client_id: %[5]s%[1]s
  dead_letter_topic: %[6]s
  session_timeout: %[7]s
  rebalance_timeout: %[8]s
  commit_interval: 1s
batch:
  max_records: %[9]d
decode:
  max_record_bytes: %[10]d
postgres:
  dsn: %[11]q
  schema: %[12]s
  pool_size: %[13]d
  tx_timeout: %[14]s
log:
  level: info
  format: text
http:
  addr: 127.0.0.1:%[15]d
drain_timeout: %[16]s
`, name, strings.Join(c.Brokers, ", "), c.Topic, c.Group, appPrefix, c.DLQ, c.SessionTimeout,
		3*c.SessionTimeout, c.BatchRecords, c.MaxRecordBytes, dsn, c.Schema, c.PoolSize, c.TxTimeout, port,
		3*c.SessionTimeout/2, c.GroupProtocol)
}

// appPrefix starts every member's client id and Postgres application_name.
const appPrefix = "chaos-"

// proc is one running onceflow process: one incarnation of a slot.
type proc struct {
	name   string // slot.incarnation, e.g. m2.3
	pid    int
	log    string
	port   int
	exited chan struct{} // closed once the process has exited and been reaped
	state  *os.ProcessState

	mu       sync.Mutex
	signaled string // the last signal the harness sent: "" if none
}

func (p *proc) signal(sig syscall.Signal, name string) {
	p.mu.Lock()
	p.signaled = name
	p.mu.Unlock()
	_ = syscall.Kill(p.pid, sig)
}

// slot is a member's place in the group: a supervisor restarts its process
// whenever it exits, until the slot is retired.
type slot struct {
	name string
	mu   sync.Mutex
	cur  *proc
	inc  int
	// restartAfter is how long the supervisor waits before the next
	// incarnation; set by a kill, else a second.
	restartAfter time.Duration
	retired      bool
	done         chan struct{} // closed when the supervisor has returned
	lastExit     string        // the last line of the last process that exited on its own
}

func (s *slot) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// memberSet owns every onceflow process of the run: it starts them, signals
// them and restarts them, and stop ends them all. Its methods are safe for
// concurrent use.
type memberSet struct {
	bin     string
	dir     string // the run directory: configs in members/, logs in logs/
	cfg     memberConfig
	env     []string
	events  *timeline
	ctx     context.Context // ends the supervisors (stop)
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	exits   atomic.Int64 // exits the harness did not cause
	slowEnd atomic.Int64 // members that did not exit within drainBound of a SIGTERM

	mu       sync.Mutex
	held     chan struct{} // while not nil, no supervisor starts a process (hold); closed on release
	starting int           // processes being started: admitted, not yet current
	base     []*slot       // the group's regular members, in start order; faults pick from these
	all      []*slot
	next     map[string]int // next slot number per prefix
	ports    map[int]bool   // HTTP ports in use
	// portBase is the members' first HTTP port: memberPortOffset above
	// the broker's, so that runs on other -kafka-port's do not collide.
	portBase int
}

// memberPortOffset puts the members' HTTP ports above the broker's port
// (29300 and up for the default 29092).
const memberPortOffset = 208

// drainBound is how long a SIGTERMed member may take to drain before the
// harness kills it (and reports it).
const drainBound = 45 * time.Second

func newMemberSet(bin, dir string, cfg memberConfig, env []string, events *timeline) (*memberSet, error) {
	for _, d := range []string{"members", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &memberSet{bin: bin, dir: dir, cfg: cfg, env: env, events: events, ctx: ctx, cancel: cancel,
		next: map[string]int{}, ports: map[int]bool{}}, nil
}

// add starts a new slot: "m" for a regular member, "s" for a storm's. It
// waits for its first process to start, so for a hold to be released:
// never call it under a hold of one's own.
func (ms *memberSet) add(prefix string) *slot {
	ms.mu.Lock()
	ms.next[prefix]++
	sl := &slot{name: fmt.Sprintf("%s%d", prefix, ms.next[prefix]), done: make(chan struct{})}
	if prefix == "m" {
		ms.base = append(ms.base, sl)
	}
	ms.all = append(ms.all, sl)
	ms.wg.Add(1)
	ms.mu.Unlock()
	ready := make(chan struct{})
	go ms.supervise(sl, ready)
	<-ready
	return sl
}

// pick returns the regular member at index i modulo their number.
func (ms *memberSet) pick(i int) *slot {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if len(ms.base) == 0 {
		return nil
	}
	return ms.base[i%len(ms.base)]
}

// retire takes sl out of the regular members; its process is not
// restarted once it exits.
func (ms *memberSet) retire(sl *slot) {
	ms.mu.Lock()
	ms.base = slices.DeleteFunc(ms.base, func(s *slot) bool { return s == sl })
	ms.mu.Unlock()
	sl.mu.Lock()
	sl.retired = true
	sl.mu.Unlock()
}

// supervise runs sl's incarnations one after another until sl is retired
// or the set stops. ready is closed once the first one has started (or
// could not).
func (ms *memberSet) supervise(sl *slot, ready chan struct{}) {
	defer ms.wg.Done()
	defer close(sl.done)
	for first := true; ; first = false {
		p, err := ms.start(sl)
		if first {
			close(ready)
		}
		if err != nil {
			if ms.ctx.Err() != nil {
				return // stopping: not started, as none will be
			}
			ms.events.add("member %s did not start: %v", sl.name, err)
			if !ms.sleep(time.Second) {
				return
			}
			continue
		}
		ms.waitExit(sl, p)
		sl.mu.Lock()
		retired, delay := sl.retired, sl.restartAfter
		sl.restartAfter = time.Second
		sl.cur = nil
		sl.mu.Unlock()
		p.mu.Lock()
		caused := p.signaled != ""
		p.mu.Unlock()
		if !caused {
			ms.exits.Add(1)
			last := tail(p.log, 1)
			say := ms.events.add
			if last == sl.lastExit {
				say = ms.events.note // printed once per member and reason
			}
			sl.lastExit = last
			say("member %s (pid %d) exited on its own (%v); its last line: %s", p.name, p.pid, p.state, last)
		}
		if retired || ms.ctx.Err() != nil {
			return
		}
		if !ms.sleep(delay) {
			return
		}
	}
}

// hold keeps every supervisor from starting a process until release is
// called (once or more): a member that exits meanwhile, stopped by
// haltAll or killed, is restarted only then.
func (ms *memberSet) hold() (release func()) {
	h := make(chan struct{})
	ms.mu.Lock()
	ms.held = h
	ms.mu.Unlock()
	return sync.OnceFunc(func() {
		ms.mu.Lock()
		ms.held = nil
		ms.mu.Unlock()
		close(h)
	})
}

// admit waits until no hold is on and counts a process being started
// (startDone uncounts it); false: the set is stopping.
func (ms *memberSet) admit() bool {
	for {
		ms.mu.Lock()
		h := ms.held
		if h == nil {
			ms.starting++
			ms.mu.Unlock()
			return true
		}
		ms.mu.Unlock()
		select {
		case <-h:
		case <-ms.ctx.Done():
			return false
		}
	}
}

func (ms *memberSet) startDone() {
	ms.mu.Lock()
	ms.starting--
	ms.mu.Unlock()
}

// idle reports whether no member runs and none is being started.
func (ms *memberSet) idle() bool {
	ms.mu.Lock()
	starting := ms.starting
	ms.mu.Unlock()
	return starting == 0 && len(ms.running()) == 0
}

// haltAll, under a hold, stops the whole group as an operator would:
// SIGTERM to every running member (each drains and leaves the group),
// SIGKILL to one still running drainBound later. It returns once no
// member runs and none is being started (one admitted as the hold came
// is waited for, and stopped too), with the names of those it had to
// kill.
func (ms *memberSet) haltAll() []string {
	var killed []string
	for {
		procs := ms.running()
		if len(procs) == 0 {
			if ms.idle() || !ms.sleep(100*time.Millisecond) {
				return killed
			}
			continue
		}
		for _, p := range procs {
			p.signal(syscall.SIGTERM, "halt")
		}
		for _, p := range procs {
			select {
			case <-p.exited:
			case <-time.After(drainBound):
				killed = append(killed, p.name)
				p.signal(syscall.SIGKILL, "kill")
				<-p.exited
			}
		}
	}
}

// waitExit waits for p to exit. A retired slot's process that drains
// longer than drainBound after its SIGTERM is killed.
func (ms *memberSet) waitExit(sl *slot, p *proc) {
	for {
		select {
		case <-p.exited:
			return
		case <-ms.ctx.Done():
			<-p.exited // stop kills it
			return
		case <-time.After(time.Second):
		}
		p.mu.Lock()
		termed := p.signaled == "term"
		p.mu.Unlock()
		if !termed {
			continue
		}
		select {
		case <-p.exited:
			return
		case <-time.After(drainBound):
			ms.slowEnd.Add(1)
			ms.events.add("member %s (pid %d) still running %v after SIGTERM: killed", p.name, p.pid, drainBound)
			p.signal(syscall.SIGKILL, "kill")
			<-p.exited
			return
		}
	}
}

func (ms *memberSet) sleep(d time.Duration) bool {
	select {
	case <-ms.ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// start starts sl's next incarnation, once no hold is on.
func (ms *memberSet) start(sl *slot) (*proc, error) {
	if !ms.admit() {
		return nil, errors.New("the member set is stopping")
	}
	defer ms.startDone() // once the process is sl's current one, or failed
	sl.mu.Lock()
	sl.inc++
	name := fmt.Sprintf("%s.%d", sl.name, sl.inc)
	sl.mu.Unlock()
	port := ms.port()
	cfgPath := filepath.Join(ms.dir, "members", name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(ms.cfg.yaml(name, port)), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(ms.dir, "logs", name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(ms.bin, "run", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = ms.env
	// Its own process group, so that a ^C to the harness reaches only the
	// harness, which then ends the members itself; and killed should the
	// harness die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		ms.freePort(port)
		return nil, fmt.Errorf("start %s: %w", ms.bin, err)
	}
	p := &proc{name: name, pid: cmd.Process.Pid, log: logPath, port: port, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		p.state = cmd.ProcessState
		ms.freePort(port)
		close(p.exited)
	}()
	sl.mu.Lock()
	sl.cur = p
	sl.mu.Unlock()
	if ms.ctx.Err() != nil {
		p.signal(syscall.SIGKILL, "kill") // started while stop was ending them all
	}
	ms.events.note("member %s started (pid %d, http 127.0.0.1:%d)", name, p.pid, port)
	return p, nil
}

func (ms *memberSet) port() int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for p := ms.portBase; ; p++ {
		if !ms.ports[p] {
			ms.ports[p] = true
			return p
		}
	}
}

func (ms *memberSet) freePort(p int) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.ports, p)
}

// kill sends SIGKILL to sl's process; the supervisor restarts it after
// restart.
func (ms *memberSet) kill(sl *slot, restart time.Duration) (*proc, error) {
	sl.mu.Lock()
	p := sl.cur
	sl.restartAfter = restart
	sl.mu.Unlock()
	if p == nil {
		return nil, errors.New("no process running")
	}
	p.signal(syscall.SIGKILL, "kill")
	return p, nil
}

// term retires sl and sends its process SIGTERM: it drains and leaves the
// group, and is not restarted.
func (ms *memberSet) term(sl *slot) (*proc, error) {
	ms.retire(sl)
	p := sl.current()
	if p == nil {
		return nil, errors.New("no process running")
	}
	p.signal(syscall.SIGTERM, "term")
	return p, nil
}

// pause stops sl's process with SIGSTOP for d, then continues it.
func (ms *memberSet) pause(ctx context.Context, sl *slot, d time.Duration) (*proc, error) {
	p := sl.current()
	if p == nil {
		return nil, errors.New("no process running")
	}
	p.signal(syscall.SIGSTOP, "stop")
	select {
	case <-ctx.Done():
	case <-p.exited:
	case <-time.After(d):
	}
	_ = syscall.Kill(p.pid, syscall.SIGCONT)
	return p, nil
}

// running returns the processes alive now.
func (ms *memberSet) running() []*proc {
	ms.mu.Lock()
	all := slices.Clone(ms.all)
	ms.mu.Unlock()
	var out []*proc
	for _, sl := range all {
		if p := sl.current(); p != nil {
			out = append(out, p)
		}
	}
	return out
}

// stop ends every member: SIGTERM, and SIGKILL for those still running
// after grace. It returns the names of those that had to be killed.
// It waits for every supervisor.
func (ms *memberSet) stop(grace time.Duration) []string {
	ms.mu.Lock()
	all := slices.Clone(ms.all)
	ms.mu.Unlock()
	for _, sl := range all {
		sl.mu.Lock()
		sl.retired = true
		sl.mu.Unlock()
	}
	var killed []string
	procs := ms.running()
	for _, p := range procs {
		_ = syscall.Kill(p.pid, syscall.SIGCONT)
		p.signal(syscall.SIGTERM, "term")
	}
	deadline := time.After(grace)
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-deadline:
			deadline = nil
		}
		select {
		case <-p.exited:
		default:
			killed = append(killed, p.name)
			p.signal(syscall.SIGKILL, "kill")
		}
	}
	ms.cancel()
	for _, p := range ms.running() {
		p.signal(syscall.SIGKILL, "kill")
	}
	ms.wg.Wait()
	return killed
}

// logs returns every member log written so far.
func (ms *memberSet) logs() []string {
	files, _ := filepath.Glob(filepath.Join(ms.dir, "logs", "*.log"))
	return files
}

// timeline records what the harness did, with times, to a file and in
// memory for the evidence. Safe for concurrent use.
type timeline struct {
	mu    sync.Mutex
	f     *os.File
	start time.Time
	lines []timedLine
}

type timedLine struct {
	at    time.Time
	text  string
	fault bool // a fault, or the services coming back: shown beside member logs in the evidence
}

func newTimeline(path string) (*timeline, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &timeline{f: f, start: time.Now()}, nil
}

// add records a line and prints it.
func (t *timeline) add(format string, args ...any) { t.record(true, false, format, args...) }

// note records a line without printing it.
func (t *timeline) note(format string, args ...any) { t.record(false, false, format, args...) }

// fault records and prints a line about a fault.
func (t *timeline) fault(format string, args ...any) { t.record(true, true, format, args...) }

func (t *timeline) record(echo, fault bool, format string, args ...any) {
	now := time.Now()
	text := fmt.Sprintf(format, args...)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, timedLine{now, text, fault})
	fmt.Fprintf(t.f, "time=%s chaos: %s\n", now.UTC().Format(time.RFC3339Nano), text)
	if echo {
		fmt.Printf("%7.1fs  %s\n", now.Sub(t.start).Seconds(), text)
	}
}

// faultsBetween returns the fault lines recorded in [from, to].
func (t *timeline) faultsBetween(from, to time.Time) []timedLine {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []timedLine
	for _, l := range t.lines {
		if l.fault && !l.at.Before(from) && !l.at.After(to) {
			out = append(out, l)
		}
	}
	return out
}

func (t *timeline) close() error { return t.f.Close() }
