package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// kafkaTopic is where the stream is: an embedded cluster, or a topic of
// the benchmark's own on real brokers. close deletes what it made.
type kafkaTopic struct {
	brokers []string
	topic   string
	opts    []kgo.Opt
	close   func(context.Context) error
}

// openKafka starts the embedded cluster with topic, or creates a topic of
// its own on c.Brokers, Topic-bench-<id> (id: the run's, see runLock).
func openKafka(ctx context.Context, c Config, id string) (*kafkaTopic, error) {
	if len(c.Brokers) == 0 {
		cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(c.Partitions), c.Topic),
			kfake.GroupMinSessionTimeout(100*time.Millisecond),
			// Under the consumer group protocol the broker sets the
			// session and the heartbeat: members.Tuned's, as under
			// classic. (A real Kafka's are its own: 45s and 5s by
			// default.)
			kfake.BrokerConfigs(map[string]string{
				"group.consumer.session.timeout.ms":    "3000",
				"group.consumer.heartbeat.interval.ms": "300",
			}))
		if err != nil {
			return nil, fmt.Errorf("embedded kafka: %w", err)
		}
		return &kafkaTopic{brokers: cl.ListenAddrs(), topic: c.Topic, close: func(context.Context) error { cl.Close(); return nil }}, nil
	}
	topic := c.Topic + "-bench-" + id
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.KafkaOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	adm := kadm.NewClient(cl)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := adm.CreateTopic(cctx, int32(c.Partitions), -1, nil, topic)
	if err == nil {
		err = r.Err
	}
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
	return &kafkaTopic{brokers: c.Brokers, topic: topic, opts: c.KafkaOptions, close: func(ctx context.Context) error {
		defer cl.Close()
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		deleteGroups(dctx, adm, id)
		rs, err := adm.DeleteTopics(dctx, topic)
		if err == nil {
			err = rs.Error()
		}
		if err != nil {
			return fmt.Errorf("delete topic %s: %w", topic, err)
		}
		return nil
	}}, nil
}

// deleteGroups deletes the consumer groups of the run whose id is id
// (onceflow-bench-…-<id>…, as bench names them), at its end: best effort,
// a group the brokers refuse to delete (a static member not yet expired)
// expires with its offsets by the brokers' retention.
func deleteGroups(ctx context.Context, adm *kadm.Client, id string) {
	ls, err := adm.ListGroups(ctx)
	if err != nil {
		return
	}
	var gs []string
	for _, g := range ls.Groups() {
		if strings.HasPrefix(g, "onceflow-bench-") && strings.Contains(g, "-"+id) {
			gs = append(gs, g)
		}
	}
	if len(gs) > 0 {
		_, _ = adm.DeleteGroups(ctx, gs...)
	}
}

// produce sends recs, in order, and waits for every acknowledgement.
func (k *kafkaTopic) produce(ctx context.Context, recs []*kgo.Record) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5 * time.Millisecond), kgo.ProducerBatchCompression(kgo.NoCompression())}, k.opts...)...)
	if err != nil {
		return fmt.Errorf("kafka producer: %w", err)
	}
	defer cl.Close()
	var mu sync.Mutex
	var first error
	for _, r := range recs {
		r.Topic = k.topic
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	if first != nil {
		return fmt.Errorf("produce: %w", first)
	}
	return nil
}

// runner is a group member: a pipeline.Runner, the pipeline of `onceflow
// run`. Its Crash is a kill (pipeline.Runner.Kill): it never leaves the
// group.
type runner struct {
	name   string
	p      *pipeline.Runner
	cancel context.CancelFunc
	done   chan error // buffered: Run's goroutine never waits
	once   sync.Once
	err    error
}

func (m *runner) Name() string           { return m.name }
func (m *runner) Stats() processor.Stats { return m.p.Stats() }
func (m *runner) Leave() error           { m.cancel(); return m.wait() }
func (m *runner) Crash() error           { m.p.Kill(); return m.wait() }
func (m *runner) wait() error {
	m.once.Do(func() {
		m.err = <-m.done
		m.cancel()
		if m.err != nil {
			m.err = fmt.Errorf("%s: %w", m.name, m.err)
		}
	})
	return m.err
}

// groupStats are what a group's members' committed batches add up to.
type groupStats struct {
	applied atomic.Int64 // (event, handler) pairs applied
	last    atomic.Int64 // the last batch's COMMIT, Unix nanoseconds; 0 before

	mu      sync.Mutex
	members processor.Stats // the counters of the groups' members, summed once each group stopped
	durs    []time.Duration // every committed batch's, from its closing to its COMMIT
}

// groupRun is one consumer group's part of a scenario run.
type groupRun struct {
	pool     *pgxpool.Pool
	schema   string
	group    string
	protocol processor.GroupProtocol
	kafka    *kafkaTopic // the stream: JSON's, or format's
	format   *Format     // nil: JSON
	want     int64       // records committed that end it
	start    time.Time   // the run's
	label    string
	storm    bool
	static   bool   // members with instance ids (storm, Config.InstanceID)
	prefix   string // of the members' names in own: the replay's second group's differ
	r        *RunResult
	st       *groupStats
	own      *owners
	// wrote holds the first *WroteError of the members' handlers (stop):
	// consume ends the run with it. Made by consume; size 1.
	wrote chan error
}

// stop ends the run with err, the first a handler's guard met: the
// members' transactions are rolled back meanwhile, never committed.
func (g *groupRun) stop(err error) {
	select {
	case g.wrote <- err:
	default: // one is there already
	}
}

// starter starts members of g's group, counting their batches in g.st
// and registering them with g.own.
func (b *benchRun) starter(g *groupRun) members.Starter {
	return func(ctx context.Context, name string) (members.Member, error) {
		hs, err := b.cfg.Handlers(g.schema)
		if err != nil {
			return nil, err
		}
		hs = guardHandlers(hs, b.iso.guard(g.schema), g.stop)
		if g.kafka.topic != b.cfg.Topic {
			hs = topicAs(hs, b.cfg.Topic)
		}
		cc := members.Tuned(b.cfg.Consumer)
		cc.ClientID, cc.GroupProtocol, cc.InstanceID = name, g.protocol, ""
		if g.static {
			cc.InstanceID = "onceflow-bench-" + name
		}
		cc.KafkaOptions = append(cc.KafkaOptions, g.kafka.opts...)
		if g.format != nil {
			cc.Decode.Format, cc.Decode.Registry = g.format.Name, g.format.Decoder
		}
		next := cc.OnBatch
		cc.OnBatch = func(bi processor.BatchInfo) {
			g.st.applied.Add(int64(bi.Result.Applied))
			g.st.last.Store(time.Now().UnixNano())
			if !bi.Result.OffsetDeferred { // a batch that wrote: to its COMMIT
				g.st.mu.Lock()
				g.st.durs = append(g.st.durs, bi.Duration)
				g.st.mu.Unlock()
			}
			if next != nil {
				next(bi)
			}
		}
		p, err := pipeline.New(pipeline.Config{Brokers: g.kafka.brokers, Topics: []string{g.kafka.topic}, Group: g.group,
			Pool: g.pool, Schema: g.schema, Handlers: hs, LRUSize: b.cfg.LRUSize,
			Logger: b.cfg.Logger.With("member", name), Consumer: cc, Writer: b.cfg.Writer})
		if err != nil {
			return nil, err
		}
		g.own.add(g.prefix+name, p)
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		m := &runner{name: name, p: p, cancel: cancel, done: make(chan error, 1)}
		go func() { m.done <- p.Run(rctx) }()
		return m, nil
	}
}

// topicAs wraps hs so that they see the events of bench's own topic on
// real brokers (Config.Brokers: Topic-bench-<random>) as Topic's, as
// they do on the embedded cluster, whose topic is Topic: a handler's
// events.topic and Event.Topic are Topic, and a handler that filters
// topics (sink.TopicFilter) is asked about Topic. The Writer's own rows
// (dead letters, offsets) keep the real topic.
func topicAs(hs []sink.Handler, topic string) []sink.Handler {
	out := make([]sink.Handler, len(hs))
	for i, h := range hs {
		out[i] = wrap(h, func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
			evs := slices.Clone(events)
			for i := range evs {
				evs[i].Topic = topic
			}
			return h.Apply(ctx, tx, evs)
		}, func(f sink.TopicFilter, _ string) bool { return f.Consumes(topic) })
	}
	return out
}

// wrapped is a handler whose Apply is apply; the rest (its name, what
// it writes) is the handler it wraps.
type wrapped struct {
	sink.Handler
	apply func(ctx context.Context, tx pgx.Tx, events []sink.Event) error
}

func (h wrapped) Apply(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
	return h.apply(ctx, tx, events)
}

// filteredWrapped is wrapped of a handler that filters topics.
type filteredWrapped struct {
	wrapped
	consumes func(topic string) bool
}

func (h filteredWrapped) Consumes(topic string) bool { return h.consumes(topic) }

// wrap returns h with apply for its Apply. A handler that filters topics
// (sink.TopicFilter) stays one: it consumes what consumes answers, asked
// with h's filter; nil consumes keeps h's answers.
func wrap(h sink.Handler, apply func(context.Context, pgx.Tx, []sink.Event) error, consumes func(f sink.TopicFilter, topic string) bool) sink.Handler {
	w := wrapped{Handler: h, apply: apply}
	f, ok := h.(sink.TopicFilter)
	switch {
	case !ok:
		return w
	case consumes == nil:
		return filteredWrapped{w, f.Consumes}
	default:
		return filteredWrapped{w, func(topic string) bool { return consumes(f, topic) }}
	}
}

// Sample is one sample of a scenario run's progress, every 250 ms.
type Sample struct {
	Seconds   float64 `json:"s"`
	Committed int64   `json:"committed"` // records committed (the group's stored offsets)
	Applied   int64   `json:"applied"`   // (event, handler) pairs applied, by the run's groups
}

// Change is a membership change during a scenario run, or the replay's
// re-read.
type Change struct {
	Seconds float64 `json:"s"`
	// What: join, leave, kill (the oldest killed, a replacement started),
	// restart (a static member killed and started again under its id),
	// or reread (the replay's group stopped, a new one reading from the
	// start).
	What string `json:"what"`
	// Took is how long the change took, in seconds: a leave drains the
	// member's in-flight batches, a kill waits for the member to stop and
	// its replacement to start.
	Took float64 `json:"took_s,omitempty"`
	// RecoveryMs is the time until the rate recovered (see recovery); 0
	// when not measured: no rate before the change (nothing applied for
	// half a second yet), or the stream ended first.
	RecoveryMs float64 `json:"recovery_ms,omitempty"`
	// Held and Moved (restart): the partitions the member ran when it was
	// killed, and how many of them another member ran before the restart
	// took them back (nil: not all taken back within 30 s).
	Held  int  `json:"held,omitempty"`
	Moved *int `json:"moved,omitempty"`
}

// sampleEvery is the time between a scenario run's samples.
const sampleEvery = 250 * time.Millisecond

// stormSpacing is the least time from a storm's change returning to the
// next one starting when the changes are spread over the stream (no
// StormEvery): two samples, so that each change's effect shows in the
// series before the next one's, and a fast stream's shares, seen at
// once by one sample, do not fire several changes together.
const stormSpacing = 2 * sampleEvery

// stallAfter is how long a run may go without committing a record
// before it is given up as stuck.
const stallAfter = 90 * time.Second

// stormChange is a storm's n-th (from 1) membership change: a member
// joins, the oldest leaves, or (every third change, members.CrashTurn)
// the oldest is killed and a replacement joins — with static members,
// the oldest is killed and started again under its name, and the change
// counts how many of its partitions another member ran meanwhile.
func stormChange(ctx context.Context, g *members.Group, n int, static bool, own *owners, prefix string) (Change, error) {
	t := time.Now()
	c := Change{}
	var err error
	switch {
	case members.CrashTurn(n) && static:
		c.What = "restart"
		var m members.Member
		if m, err = g.Restart(ctx); err == nil && m != nil {
			held := own.lastHeld(prefix + m.Name())
			c.Held = len(held)
			if moved, ok := own.retaken(ctx, prefix+m.Name(), held, t, 30*time.Second); ok {
				c.Moved = &moved
			}
		}
	case members.CrashTurn(n):
		c.What = "kill"
		if _, err = g.Crash(); err == nil {
			_, err = g.Start(ctx)
		}
	case n%3 == 1:
		c.What = "join"
		_, err = g.Start(ctx)
	default:
		c.What = "leave"
		_, err = g.Leave()
	}
	c.Took = time.Since(t).Seconds()
	return c, err
}

// storm makes g's storm on grp: Config.StormChanges membership changes
// (stormChange), the first once first is closed (the group's first
// commit), then, with Config.StormEvery, one a tick (a change due while
// another runs starts when that one returns), else change k once k /
// (StormChanges+1) of the records are committed and at least
// stormSpacing after change k-1 returned. A change is never made once
// the stream has been consumed (the group's stored offsets, read just
// before it): the planned changes left are not made. Each change is
// appended to g.r.Changes, counted in made; churning is true while one
// runs. storm returns when stop is closed (after its last change, it
// waits for it) or with a change's error.
func (b *benchRun) storm(ctx context.Context, g *groupRun, grp *members.Group, first <-chan struct{},
	committed, made *atomic.Int64, churning *atomic.Bool, stop <-chan struct{}) error {
	select {
	case <-first:
	case <-stop:
		return nil
	}
	var t *time.Ticker
	if b.cfg.StormEvery > 0 {
		t = time.NewTicker(b.cfg.StormEvery)
		defer t.Stop()
	}
	var returned time.Time // the last change's return
	for n := 1; n <= b.cfg.StormChanges; n++ {
		// With StormEvery the first change is at the first commit.
		if n > 1 || t == nil {
			if !b.stormWait(t, committed, max(1, int64(n)*g.want/int64(b.cfg.StormChanges+1)), stop) {
				return nil
			}
		}
		if n > 1 && t == nil {
			select {
			case <-stop:
				return nil
			case <-time.After(time.Until(returned.Add(stormSpacing))):
			}
		}
		at := time.Since(g.start).Seconds()
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		done, err := members.Committed(qctx, g.pool, g.schema, g.group)
		cancel()
		if err != nil {
			return fmt.Errorf("storm: %w", err)
		}
		if done >= g.want {
			break // the stream is consumed: no change after it
		}
		churning.Store(true)
		c, err := stormChange(ctx, grp, n, g.static, g.own, g.prefix)
		churning.Store(false)
		returned = time.Now()
		c.Seconds = at
		b.mu.Lock()
		g.r.Changes = append(g.r.Changes, c)
		b.mu.Unlock()
		if err != nil {
			return err
		}
		made.Add(1)
	}
	<-stop
	return nil
}

// stormWait waits for a storm's next change: t's next tick when the
// storm is paced by time (t not nil), else until committed reaches at.
// It returns false when stop is closed first.
func (b *benchRun) stormWait(t *time.Ticker, committed *atomic.Int64, at int64, stop <-chan struct{}) bool {
	if t != nil {
		select {
		case <-stop:
			return false
		case <-t.C:
			return true
		}
	}
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for committed.Load() < at {
		select {
		case <-stop:
			return false
		case <-poll.C:
		}
	}
	return true
}

// consume runs a group of Config.Members members over g.schema until
// they have committed g.want records (the group's stored offsets),
// sampling into g.r.Series every sampleEvery, and returns the records
// committed and when the batch that completed them committed. With
// g.storm the group's membership changes as storm says, appended to
// g.r.Changes, and g.r.StormShort says when the stream was consumed
// before the last planned change. Every member is stopped, and the
// storm's goroutine has returned, when consume returns. It returns with
// an error when ctx ends or nothing is committed for stallAfter.
func (b *benchRun) consume(ctx context.Context, g *groupRun) (int64, time.Time, error) {
	if g.wrote == nil {
		g.wrote = make(chan error, 1)
	}
	grp := members.NewGroup(b.starter(g))
	defer func() {
		_ = grp.StopAll()
		g.st.mu.Lock()
		g.st.members = g.st.members.Plus(grp.Stats())
		g.st.mu.Unlock()
	}()
	r := g.r
	r.Series = append(r.Series, Sample{Seconds: time.Since(g.start).Seconds(), Applied: g.st.applied.Load()}) // the group has committed nothing
	for range b.cfg.Members {
		if _, err := grp.Start(ctx); err != nil {
			return 0, time.Time{}, err
		}
	}
	first := make(chan struct{}) // closed at the first commit
	var firstOnce sync.Once
	stopStorm := make(chan struct{})
	stormDone := make(chan error, 1)
	var churning atomic.Bool
	var made atomic.Int64      // changes made
	var committed atomic.Int64 // records committed at the latest sample
	if g.storm {
		r.StormPlanned = b.cfg.StormChanges
		go func() {
			stormDone <- b.storm(ctx, g, grp, first, &committed, &made, &churning, stopStorm)
		}()
	} else {
		stormDone <- nil
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		close(stopStorm)
		return <-stormDone
	}
	defer func() { _ = stop() }()
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	last, lastAt := int64(-1), time.Now()
	for {
		select {
		case <-ctx.Done():
			return 0, time.Time{}, ctx.Err()
		case err := <-g.wrote:
			return 0, time.Time{}, err
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := members.Committed(qctx, g.pool, g.schema, g.group)
		cancel()
		if err != nil {
			return 0, time.Time{}, err
		}
		committed.Store(n)
		if n > 0 {
			firstOnce.Do(func() { close(first) })
		}
		el := time.Since(g.start)
		applied := g.st.applied.Load()
		r.Series = append(r.Series, Sample{Seconds: el.Seconds(), Committed: n, Applied: applied})
		// "stops once": the batches in flight then commit too (a replay's
		// first half ends past its half).
		b.line.set("  %s: %d records committed (stops once %d are), %.0f events applied/s", g.label, n, g.want,
			float64(applied)/float64(max(len(b.names), 1))/el.Seconds())
		if n >= g.want {
			end := time.Now()
			if l := g.st.last.Load(); l > 0 {
				end = time.Unix(0, l)
			}
			err := stop() // the storm has returned: made is final
			if g.storm && made.Load() < int64(b.cfg.StormChanges) {
				r.StormShort = true
			}
			return n, end, err
		}
		if n != last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) > stallAfter && !churning.Load() {
			return 0, time.Time{}, fmt.Errorf("%s: no record committed for %v (%d of %d): the members are stuck; see the log", g.label, stallAfter, n, g.want)
		}
	}
}
