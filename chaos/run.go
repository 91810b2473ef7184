package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
)

// schema is where the members keep their tables in the chaos cluster; it
// is dropped at the start of every run.
const schema = "chaos"

// tally counts what the faults did.
type tally struct {
	kills, terms, stops, pgRestarts, brokerRestarts, storms int
	replays                                                 int // group rewinds (onceflow replay) that took
	midTx, resets, resetConns, before, after                int // connections cut by the proxy
	terminated, terminatedInCommit                          int // by pg_terminate_backend
	skipped                                                 int // faults that found no member to hit
}

func (t *tally) connCuts() int {
	return t.midTx + t.resetConns + t.before + t.after + t.terminated
}

func (t *tally) commitCuts() int { return t.before + t.after + t.terminatedInCommit }

// chaos is one run: its services, members and what happened.
type chaos struct {
	o       options
	dir     string
	svc     *services
	admin   *pgxpool.Pool // straight to Postgres: faults and verdict
	proxy   *pgProxy
	members *memberSet
	tl      *timeline
	t       tally

	// A service restart runs in the background while other faults go on;
	// brokerUp and pgUp are closed when the last one has finished.
	brokerUp, pgUp chan struct{}
	bg             sync.WaitGroup

	// What the edge faults need and saw.
	w            *workload
	led          *ledger
	prod         *producer
	topic, group string
	parts        int // the topic's partitions: another number after a recreate
	inc          int // the topic's incarnation: 1 after a recreate
	lat          *latencyOutcome
	rec          *recreateOutcome
	avro         *avroRun   // -format avro or protobuf; nil for json
	edge         sync.Mutex // held while an edge fault runs: the other faults wait for it
}

// incarnation is what tells the recreated topic's rows apart.
func (c *chaos) incarnation() incarnation {
	if c.rec == nil || c.rec.TopicID == "" {
		return incarnation{}
	}
	return incarnation{DLMark: c.rec.DLMark, TopicID: c.rec.TopicID}
}

// run is one chaos run: services and binary, members, publishing under
// faults, then the verdict; it returns the exit code. It is one function
// on purpose: each step's defer stops what that step started, so every
// path out — a setup error, an interrupt, the verdict — stops the members
// before the proxy and the services, in reverse order of their start.
func run(ctx context.Context, o options) (int, error) {
	began := time.Now()
	root, err := repoRoot()
	if err != nil {
		return exitSetup, err
	}
	unlock, err := lock(o.kafkaPort)
	if err != nil {
		return exitSetup, err
	}
	defer unlock()
	runID := fmt.Sprintf("%d-%s", o.seed, began.UTC().Format("20060102T150405"))
	dir, err := filepath.Abs(filepath.Join(o.out, runID))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return exitSetup, err
	}
	tl, err := newTimeline(filepath.Join(dir, "timeline.log"))
	if err != nil {
		return exitSetup, err
	}
	defer tl.close()
	fmt.Printf("chaos: seed=%d (replay with -seed %d)  run directory %s\n", o.seed, o.seed, dir)
	c := &chaos{o: o, dir: dir, tl: tl, parts: o.partitions, svc: &services{root: root, kafkaPort: o.kafkaPort, ctrlPort: o.ctrlPort,
		kafkaDir: o.kafkaDir, pgPort: o.pgPort, workDir: dir}, brokerUp: make(chan struct{}), pgUp: make(chan struct{})}
	close(c.brokerUp)
	close(c.pgUp)

	// Services and the binary, side by side.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Add(3)
	go func() { defer wg.Done(); errs[0] = c.svc.kafka(ctx, "start") }()
	go func() { defer wg.Done(); errs[1] = c.svc.startPostgres(ctx) }()
	go func() { defer wg.Done(); o.bin, errs[2] = build(ctx, root, filepath.Dir(dir), o.bin) }()
	wg.Wait()
	c.o.bin = o.bin
	if !o.keep {
		defer c.stopServices()
	}
	if err := errors.Join(errs...); err != nil {
		return exitSetup, err
	}
	tl.add("services up: kafka %s (%s), postgres 127.0.0.1:%d (cluster 15/chaos); onceflow %s",
		c.svc.brokers()[0], o.kafkaDir, o.pgPort, o.bin)

	if c.admin, err = pgxpool.New(ctx, c.svc.pgDSN); err != nil {
		return exitSetup, err
	}
	defer c.admin.Close()
	topic := topicPrefix + runID
	dlq := topic + ".dlq"
	group := "chaos-" + runID
	if err := resetSchema(ctx, c.admin, schema); err != nil {
		return exitSetup, err
	}
	if err := createTopics(ctx, c.svc.brokers(), topic, dlq, o.partitions); err != nil {
		return exitSetup, err
	}
	if c.proxy, err = startProxy("127.0.0.1:"+strconv.Itoa(o.proxyPort), "127.0.0.1:"+strconv.Itoa(o.pgPort)); err != nil {
		return exitSetup, err
	}
	defer c.proxy.stop()
	defer c.bg.Wait() // before the services stop

	mcfg := memberConfig{Brokers: c.svc.brokers(), Topic: topic, DLQ: dlq, Group: group, GroupProtocol: o.protocol, SessionTimeout: o.session,
		BatchRecords: o.batch, MaxRecordBytes: o.maxRecord, Schema: schema, PoolSize: 4, TxTimeout: 10 * time.Second,
		DSN: strings.Replace(c.svc.pgDSN, ":"+strconv.Itoa(o.pgPort)+"/", ":"+strconv.Itoa(o.proxyPort)+"/", 1)}
	if err := c.migrate(ctx, mcfg); err != nil {
		return exitSetup, err
	}
	w, err := newWorkload(o.seed, workloadConfig{Events: o.events, Duplicates: o.duplicates, OtherPartition: 0.3,
		Partitions: o.partitions, Poison: o.poison, PoisonScale: o.poisonScale, MaxRecordBytes: o.maxRecord})
	if err != nil {
		return exitSetup, err
	}
	if o.format != formatJSON {
		if c.avro, err = c.startAvro(ctx, topic, w); err != nil {
			return exitSetup, err
		}
	}
	led := newLedger(w)
	c.w, c.led, c.topic, c.group = w, led, topic, group
	sched := newSchedule(o.seed, scheduleConfig{Kinds: o.faults, Window: o.duration, Gap: o.gap,
		MinKills: o.minKills, SessionTimeout: o.session})
	if err := writeSchedule(filepath.Join(dir, "schedule.txt"), o.seed, sched); err != nil {
		return exitSetup, err
	}
	poison := 0
	for _, r := range w.Records {
		if r.poison() {
			poison++
		}
	}
	tl.add("workload: %d records: %d orders, %d redeliveries, %d poison, over %v on %d partitions of %s",
		len(w.Records), len(w.Orders), len(w.Records)-len(w.Orders)-poison, poison, o.duration, o.partitions, topic)
	tl.add("schedule: %d faults over %v (%s); %s", len(sched), o.duration, countKinds(sched), filepath.Join(dir, "schedule.txt"))

	// The backlog (-backlog) goes out before any member runs: they start
	// behind, with more waiting than their queues hold, so partitions are
	// paused at their high water and resumed while the faults begin.
	prod, err := newProducer(c.svc.brokers(), o.partitions)
	if err != nil {
		return exitSetup, err
	}
	c.prod = prod
	defer prod.close()
	upfront := int(float64(len(w.Records)) * o.backlog)
	if upfront > 0 {
		if err := publish(ctx, prod, topic, w.Records[:upfront], led, 0); err != nil {
			return exitSetup, fmt.Errorf("publish the backlog: %w", err)
		}
		tl.add("backlog: %d records published before the members start", upfront)
	}

	env := memberEnv(append(c.avro.memberEnv(), o.memberEnv...))
	if c.members, err = newMemberSet(o.bin, dir, mcfg, env, tl); err != nil {
		return exitSetup, err
	}
	c.members.portBase = o.kafkaPort + memberPortOffset
	membersStopped := false
	defer func() {
		if !membersStopped {
			c.members.stop(5 * time.Second)
		}
	}()
	for range o.members {
		c.members.add("m")
	}
	if err := c.waitHealthy(ctx, time.Minute); err != nil {
		return exitSetup, err
	}

	// Publish the rest and inject faults at the same time.
	pubCtx, cancelPub := context.WithCancel(ctx)
	var pub sync.WaitGroup
	defer pub.Wait() // before the client closes
	defer cancelPub()
	pubDone := make(chan error, 1)
	pub.Add(1)
	go func() {
		defer pub.Done()
		pubDone <- publish(pubCtx, prod, topic, w.Records[upfront:], led, o.duration*85/100)
	}()
	waitRestarts := c.registryRestarts(ctx, c.avro)
	c.runFaults(ctx, sched)
	waitRestarts()
	if ctx.Err() != nil {
		return exitSetup, errors.New("interrupted")
	}
	tl.fault("faults stopped: %d kills, %d terms, %d stops, %d postgres restarts, %d broker restarts, %d connections cut, %d storms",
		c.t.kills, c.t.terms, c.t.stops, c.t.pgRestarts, c.t.brokerRestarts, c.t.connCuts(), c.t.storms)
	var pubErr error
	select {
	case pubErr = <-pubDone:
	case <-time.After(o.settle):
		cancelPub()
		pubErr = errors.Join(errors.New("the producer did not finish within -settle after the faults"), <-pubDone)
	}
	published, acked, failed := led.counts()
	tl.add("producer done: %d records published, %d acknowledged, %d failed (their content resent)", published, acked, failed)
	if pubErr != nil {
		tl.add("producer: %v", pubErr)
	}

	found, ends, err := readTopic(ctx, c.svc.brokers(), topic, c.parts, c.inc)
	if err != nil {
		return exitSetup, err
	}
	if c.rec != nil {
		found = append(found, c.rec.Old...)
	}
	exp := expect(w, led, found, ends, c.inc)

	settled := c.waitForEnd(ctx, group, topic, ends)
	committed, cerr := committedOffsets(ctx, c.svc.brokers(), group, topic)
	if cerr != nil {
		tl.add("kafka committed offsets: %v", cerr)
	}
	killed := c.members.stop(30 * time.Second)
	membersStopped = true
	if len(killed) > 0 {
		tl.add("members killed after 30s without exiting on SIGTERM: %s", strings.Join(killed, ", "))
	}

	obs, err := observe(ctx, c.admin, schema, group, topic, c.incarnation())
	if err != nil {
		return exitSetup, err
	}
	v := judge(exp, obs, orders.Names)
	v.Edge = append(c.edgeFailures(), formatFailures(c.avro, exp, obs)...)
	check, err := orders.Check(ctx, c.admin, schema, exp.Orders)
	if err != nil {
		return exitSetup, err
	}
	rep := &report{c: c, exp: exp, obs: obs, v: v, check: check, committed: committed, settled: settled,
		slowStops: killed, pubErr: pubErr, elapsed: time.Since(began), topic: topic, group: group}
	return rep.write(), nil
}

// runFaults applies sched in order, each at its time (or as soon as the
// one before it has finished); an edge fault, which the others wait for,
// moves the rest of the schedule by its duration.
func (c *chaos) runFaults(ctx context.Context, sched []fault) {
	start := time.Now()
	for i, f := range sched {
		if d := time.Until(start.Add(f.At)); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			return
		}
		t0 := time.Now()
		edge := slices.Contains(edgeFaults, f.Kind)
		if edge {
			c.edge.Lock() // no registry restart (format.go) during an edge fault
		}
		c.apply(ctx, i+1, f)
		if edge {
			c.edge.Unlock()
			// The faults after an edge fault keep their spacing, rather
			// than all coming at once when it ends.
			start = start.Add(time.Since(t0))
		}
	}
	if d := time.Until(start.Add(c.o.duration)); d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	c.bg.Wait()
}

// apply carries out fault number n. It is one switch over the fault
// kinds on purpose: each case is the whole of one kind, read top to bottom.
func (c *chaos) apply(ctx context.Context, n int, f fault) {
	tl, ms := c.tl, c.members
	say := func(format string, args ...any) { tl.fault("fault %d: "+format, append([]any{n}, args...)...) }
	member := func() *slot {
		sl := ms.pick(f.Target)
		if sl == nil || sl.current() == nil {
			c.t.skipped++
			say("%s: no member running at that moment; skipped", f.Kind)
			return nil
		}
		return sl
	}
	switch f.Kind {
	case faultKill:
		if sl := member(); sl != nil {
			if p, err := ms.kill(sl, f.Pause); err == nil {
				c.t.kills++
				say("SIGKILL %s (pid %d); restart in %v", p.name, p.pid, f.Pause)
			}
		}
	case faultTerm:
		if sl := member(); sl != nil {
			if p, err := ms.term(sl); err == nil {
				c.t.terms++
				say("SIGTERM %s (pid %d); a replacement starts now", p.name, p.pid)
				ms.add("m")
			}
		}
	case faultStop:
		if sl := member(); sl != nil {
			c.t.stops++
			p := sl.current()
			say("SIGSTOP %s (pid %d) for %v (session timeout %v)", p.name, p.pid, f.Pause, c.o.session)
			ms.pause(ctx, sl, f.Pause)
			say("SIGCONT %s (pid %d): it wakes up a zombie", p.name, p.pid)
		}
	case faultPGRestart:
		if !waitUp(ctx, c.pgUp) {
			return
		}
		c.t.pgRestarts++
		t0 := time.Now()
		if f.Pause == 0 {
			say("postgres restart -m immediate")
			if err := c.svc.postgres(ctx, "crash"); err != nil {
				say("postgres restart: %v", err)
				return
			}
			say("postgres up again after %v", time.Since(t0).Round(time.Millisecond))
			return
		}
		say("postgres stop -m immediate; start it again in %v (other faults go on meanwhile)", f.Pause)
		if err := c.svc.postgres(ctx, "kill"); err != nil {
			say("postgres stop: %v", err)
		}
		c.pgUp = c.later(ctx, f.Pause, "postgres", func() error { return c.svc.postgres(ctx, "start") }, say)
	case faultBrokerRestart:
		if !waitUp(ctx, c.brokerUp) {
			return
		}
		c.t.brokerRestarts++
		say("kill -9 the broker; start it again in %v (other faults go on meanwhile)", f.Pause)
		if err := c.svc.kafka(ctx, "crash"); err != nil {
			say("broker kill: %v", err)
		}
		c.brokerUp = c.later(ctx, f.Pause, "broker", func() error { return c.svc.kafka(ctx, "start") }, say)
	case faultConnCut:
		switch f.Variant {
		case cutMidTx:
			cut, err := c.proxy.cut(ctx, cutMidTx, f.N, f.Skip, 5*time.Second)
			c.t.midTx += cut
			say("cut %d of %d connections mid-transaction (after %d writes of a transaction)%s", cut, f.N, f.Skip, errSuffix(err))
		case cutAll:
			cut, err := c.proxy.cut(ctx, cutAll, 1<<20, 0, 0)
			c.t.resets++
			c.t.resetConns += cut
			say("cut every connection to postgres at once: %d%s", cut, errSuffix(err))
		case cutTerminate:
			k, inCommit, err := terminateBackends(ctx, c.admin, appPrefix, f.N, 5*time.Second)
			c.t.terminated += k
			c.t.terminatedInCommit += inCommit
			say("pg_terminate_backend on %d of %d backends (%d in COMMIT, %d idle in transaction)%s", k, f.N, inCommit, k-inCommit, errSuffix(err))
		}
	case faultCommitCut:
		cut, err := c.proxy.cut(ctx, f.Variant, f.N, 0, 5*time.Second)
		if f.Variant == cutBefore {
			c.t.before += cut
			say("cut %d of %d connections on COMMIT, before postgres got it%s", cut, f.N, errSuffix(err))
		} else {
			c.t.after += cut
			say("cut %d of %d connections after postgres committed, before the member heard%s", cut, f.N, errSuffix(err))
		}
	case faultStorm:
		c.t.storms++
		say("rebalance storm: %d members join", f.N)
		var joined []*slot
		for range f.N {
			joined = append(joined, ms.add("s"))
			if !sleepCtx(ctx, 300*time.Millisecond) {
				return
			}
		}
		sleepCtx(ctx, f.Pause)
		for i, sl := range joined {
			if i == f.Target%len(joined) {
				ms.retire(sl)
				if p, err := ms.kill(sl, 0); err == nil {
					c.t.kills++
					say("storm: SIGKILL %s (pid %d)", p.name, p.pid)
				}
			} else if p, err := ms.term(sl); err == nil {
				say("storm: SIGTERM %s (pid %d)", p.name, p.pid)
			}
			sleepCtx(ctx, 300*time.Millisecond)
		}
	case faultReplay:
		if !waitUp(ctx, c.pgUp) || !waitUp(ctx, c.brokerUp) {
			return
		}
		release := ms.hold()
		defer release()
		target := []string{"--to-time", fmt.Sprintf("%ds", f.N)}
		if f.Variant == replayToStart {
			target = []string{"--to-start"}
		}
		say("replay: stop the group (SIGTERM every member), rewind it (onceflow replay %s), start it again %v after the stop", strings.Join(target, " "), f.Pause)
		t0 := time.Now()
		if killed := ms.haltAll(); len(killed) > 0 {
			say("replay: %s still running %v after SIGTERM: killed", strings.Join(killed, ", "), drainBound)
		}
		out, tries, err := c.rewind(ctx, n, target)
		switch {
		case err != nil:
			say("replay: %v; the group starts again (rewound in Postgres or not, as the tries left it)", err)
		case strings.HasPrefix(out, "group ") && strings.Contains(out, "nothing to rewind"):
			say("replay: not counted: %s", out) // a rewind just before reached further back
		default:
			c.t.replays++
			say("replay: rewound (try %d, %v after the stop began): %s", tries, time.Since(t0).Round(time.Millisecond), out)
		}
		sleepCtx(ctx, time.Until(t0.Add(f.Pause)))
		release()
	case faultLatency:
		c.lat = c.runLatency(ctx, f, say)
	case faultRecreate:
		c.recreate(ctx, f, say)
	}
}

// rewind runs onceflow replay with the target's flags and a member's
// configuration against the stopped group until it takes: it refuses
// while the group has members, and a member the stop had to kill stays in
// the group until its session times out. It returns the rewind's summary
// and the tries it took; every try's output is in logs/replay-<n>.log.
func (c *chaos) rewind(ctx context.Context, n int, target []string) (string, int, error) {
	ms := c.members
	name := fmt.Sprintf("replay-%d", n)
	cfgPath := filepath.Join(ms.dir, "members", name+".yaml")
	port := ms.port() // its http.addr, never served by replay
	defer ms.freePort(port)
	if err := os.WriteFile(cfgPath, []byte(ms.cfg.yaml(name, port)), 0o644); err != nil {
		return "", 0, err
	}
	logf, err := os.Create(filepath.Join(ms.dir, "logs", name+".log"))
	if err != nil {
		return "", 0, err
	}
	defer logf.Close()
	deadline := time.Now().Add(3*c.o.session + 30*time.Second)
	for tries := 1; ; tries++ {
		tctx, cancel := context.WithTimeout(ctx, time.Minute)
		cmd := exec.CommandContext(tctx, ms.bin, append([]string{"replay", "--config", cfgPath}, target...)...)
		cmd.Env = ms.env
		out, err := cmd.CombinedOutput()
		cancel()
		fmt.Fprintf(logf, "--- try %d:%s\n%s", tries, errSuffix(err), out)
		last := lastLine(out)
		if err == nil {
			return last, tries, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return "", tries, fmt.Errorf("onceflow replay failed %d times, the last: %v: %s", tries, err, last)
		}
		if !sleepCtx(ctx, time.Second) {
			return "", tries, ctx.Err()
		}
	}
}

// lastLine is the last non-empty line of out.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// later starts a service again after pause, in the background, trying
// until it answers (a service that does not come back ends nothing), and
// says how each attempt went. The returned channel is closed when it is
// done.
func (c *chaos) later(ctx context.Context, pause time.Duration, name string, start func() error, say func(string, ...any)) chan struct{} {
	t0 := time.Now()
	up := make(chan struct{})
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		defer close(up)
		if !sleepCtx(ctx, pause) {
			return
		}
		for {
			err := start()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				say("%s start: %v", name, err)
			default:
				say("%s up again after %v", name, time.Since(t0).Round(time.Millisecond))
				return
			}
		}
	}()
	return up
}

// waitUp waits until a service restarted in the background is up.
func waitUp(ctx context.Context, up chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-up:
		return true
	}
}

// waitForEnd waits, up to -settle, until every partition's stored offset
// is its end offset, and returns how long that took (or -1 if it did not
// happen). It keeps the group's members running meanwhile.
func (c *chaos) waitForEnd(ctx context.Context, group, topic string, ends map[int32]int64) time.Duration {
	start := time.Now()
	deadline := start.Add(c.o.settle)
	c.tl.add("waiting up to %v for every partition to reach its end", c.o.settle)
	lastSay := start
	for {
		for _, p := range c.members.running() {
			_ = syscall.Kill(p.pid, syscall.SIGCONT)
		}
		stored, err := members.StoredOffsets(ctx, c.admin, schema, group, topic, c.incarnation().TopicID)
		behind := []string{}
		if err == nil {
			for p := range int32(c.parts) {
				if s, ok := stored[p]; ends[p] > 0 && (!ok || s < ends[p]) {
					behind = append(behind, fmt.Sprintf("%d at %d/%d", p, s, ends[p]))
				}
			}
			if len(behind) == 0 {
				d := time.Since(start)
				c.tl.fault("every partition reached its end %v after the faults stopped", d.Round(time.Millisecond))
				return d
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.tl.fault("partitions not at their end after %v: %s", c.o.settle, strings.Join(behind, ", "))
			return -1
		}
		if time.Since(lastSay) >= 15*time.Second {
			lastSay = time.Now()
			if err != nil {
				c.tl.add("waiting: %v", err)
			} else {
				c.tl.add("waiting: partitions behind: %s", strings.Join(behind, ", "))
			}
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
}

// waitHealthy waits until every member started so far answers /healthz.
func (c *chaos) waitHealthy(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	client := &http.Client{Timeout: time.Second}
	for _, p := range c.members.running() {
		for {
			resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", p.port))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-p.exited:
				return fmt.Errorf("member %s exited at start (%v); its log %s:\n%s", p.name, p.state, p.log, tail(p.log, 20))
			default:
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("member %s does not answer /healthz on 127.0.0.1:%d after %v; its log %s:\n%s", p.name, p.port, d, p.log, tail(p.log, 20))
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
	}
	return nil
}

// migrate creates the members' tables with the binary's own migrate
// command, so that a binary from another tree brings its own schema.
func (c *chaos) migrate(ctx context.Context, mcfg memberConfig) error {
	path := filepath.Join(c.dir, "migrate.yaml")
	if err := os.WriteFile(path, []byte(mcfg.yaml("migrate", 0)), 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, c.o.bin, "migrate", "--config", path)
	cmd.Env = memberEnv(c.o.memberEnv)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s migrate: %w\n%s", c.o.bin, err, out)
	}
	return nil
}

func (c *chaos) stopServices() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.svc.kafka(ctx, "stop"); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: stop kafka:", err)
	}
	if err := c.svc.postgres(ctx, "stop"); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: stop postgres:", err)
	}
	c.stopRegistry(ctx)
}

// build compiles ./cmd/onceflow into dir (each run replaces the last
// run's), unless bin names a binary.
func build(ctx context.Context, root, dir, bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	out := filepath.Join(dir, "onceflow")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/onceflow")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/onceflow: %w\n%s", err, b)
	}
	return out, nil
}

// memberEnv is the members' environment: the harness's, without ONCEFLOW_*
// and OTEL_* variables (they would override the configuration file), plus
// extra.
func memberEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCEFLOW_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// repoRoot finds the repository root (the folder holding
// infra/chaos-kafka.sh) from the working directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "infra", "chaos-kafka.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from the onceflow repository (no infra/chaos-kafka.sh in the working directory or above)")
		}
		dir = parent
	}
}

// lock keeps two chaos runs from sharing the ports and the cluster.
func lock(port int) (func(), error) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("onceflow-chaos-%d.lock", port))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another chaos run holds %s (its services use port %d)", path, port)
	}
	return func() { f.Close() }, nil
}

func writeSchedule(path string, seed uint64, sched []fault) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# fault schedule of seed %d (times since the faults began)\n", seed)
	for i, f := range sched {
		fmt.Fprintf(&b, "%4d %8.3fs  %s\n", i+1, f.At.Seconds(), f)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func countKinds(sched []fault) string {
	n := map[faultKind]int{}
	for _, f := range sched {
		n[f.Kind]++
	}
	var parts []string
	for _, k := range allFaults {
		if n[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
		}
	}
	return strings.Join(parts, ", ")
}

func errSuffix(err error) string {
	if err != nil {
		return " (" + err.Error() + ")"
	}
	return ""
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
