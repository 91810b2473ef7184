package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/processor"
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
// its own on c.Brokers.
func openKafka(ctx context.Context, c Config) (*kafkaTopic, error) {
	if len(c.Brokers) == 0 {
		cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(c.Partitions), c.Topic),
			kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("embedded kafka: %w", err)
		}
		return &kafkaTopic{brokers: cl.ListenAddrs(), topic: c.Topic, close: func(context.Context) error { cl.Close(); return nil }}, nil
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	topic := c.Topic + "-bench-" + hex.EncodeToString(b)
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
// run`.
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
func (m *runner) Crash() error           { m.p.Abort(); return m.wait() }
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
}

// starter starts members of group over pool and schema, counting their
// batches in st.
func (b *benchRun) starter(pool *pgxpool.Pool, schema, group string, st *groupStats) members.Starter {
	return func(ctx context.Context, name string) (members.Member, error) {
		hs, err := b.cfg.Handlers(schema)
		if err != nil {
			return nil, err
		}
		cc := members.Tuned(b.cfg.Consumer)
		cc.ClientID = name
		if cc.InstanceID != "" {
			cc.InstanceID += "-" + name
		}
		cc.KafkaOptions = append(cc.KafkaOptions, b.kafka.opts...)
		next := cc.OnBatch
		cc.OnBatch = func(bi processor.BatchInfo) {
			st.applied.Add(int64(bi.Result.Applied))
			st.last.Store(time.Now().UnixNano())
			if next != nil {
				next(bi)
			}
		}
		p, err := pipeline.New(pipeline.Config{Brokers: b.kafka.brokers, Topics: []string{b.kafka.topic}, Group: group,
			Pool: pool, Schema: schema, Handlers: hs, LRUSize: b.cfg.LRUSize,
			Logger: b.cfg.Logger.With("member", name), Consumer: cc, Writer: b.cfg.Writer})
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		m := &runner{name: name, p: p, cancel: cancel, done: make(chan error, 1)}
		go func() { m.done <- p.Run(rctx) }()
		return m, nil
	}
}

// Sample is one sample of a scenario run's progress, every 250 ms.
type Sample struct {
	Seconds   float64 `json:"s"`
	Committed int64   `json:"committed"` // records committed (the group's stored offsets)
	Applied   int64   `json:"applied"`   // (event, handler) pairs applied, by the run's groups
}

// Change is a membership change during a scenario run, or the replay's
// restart.
type Change struct {
	Seconds float64 `json:"s"`
	What    string  `json:"what"` // join+leave, join+crash, restart
}

// stallAfter is how long a run may go without committing a record
// before it is given up as stuck.
const stallAfter = 90 * time.Second

// consume runs a group of c.Members members over schema until they have
// committed want records (the group's stored offsets), sampling into
// series, and returns the records committed and when the batch that
// completed them committed. With storm, the group's
// membership changes (members.Group.Churn: a join and a leave, every
// third a crash) once the first record is committed and then every
// StormEvery, and the run has at least one change: one that would come
// after the last record is waited for. It returns with an error when ctx
// ends or nothing is committed for stallAfter.
func (b *benchRun) consume(ctx context.Context, pool *pgxpool.Pool, schema, group string, want int64, start time.Time,
	label string, series *[]Sample, changes *[]Change, storm bool, st *groupStats) (int64, time.Time, error) {
	g := members.NewGroup(b.starter(pool, schema, group, st))
	defer func() {
		_ = g.StopAll()
		st.mu.Lock()
		st.members = st.members.Plus(g.Stats())
		st.mu.Unlock()
	}()
	*series = append(*series, Sample{Seconds: time.Since(start).Seconds(), Applied: st.applied.Load()}) // the group has committed nothing
	for range b.cfg.Members {
		if _, err := g.Start(ctx); err != nil {
			return 0, time.Time{}, err
		}
	}
	first := make(chan struct{}) // closed at the first commit
	var firstOnce sync.Once
	stopStorm := make(chan struct{})
	stormDone := make(chan error, 1)
	var churning atomic.Bool
	var made atomic.Int64 // changes made
	if storm {
		go func() {
			select {
			case <-first:
			case <-stopStorm:
				stormDone <- nil
				return
			}
			t := time.NewTicker(b.cfg.StormEvery)
			defer t.Stop()
			for n := 1; ; n++ {
				churning.Store(true)
				crashed, err := g.Churn(ctx, n)
				churning.Store(false)
				if err != nil {
					stormDone <- err
					return
				}
				what := "join+leave"
				if crashed {
					what = "join+crash"
				}
				b.mu.Lock()
				*changes = append(*changes, Change{Seconds: time.Since(start).Seconds(), What: what})
				b.mu.Unlock()
				made.Add(1)
				select {
				case <-stopStorm:
					stormDone <- nil
					return
				case <-t.C:
				}
			}
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
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last, lastAt := int64(-1), time.Now()
	for {
		select {
		case <-ctx.Done():
			return 0, time.Time{}, ctx.Err()
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := members.Committed(qctx, pool, schema, group)
		cancel()
		if err != nil {
			return 0, time.Time{}, err
		}
		if n > 0 {
			firstOnce.Do(func() { close(first) })
		}
		el := time.Since(start)
		applied := st.applied.Load()
		*series = append(*series, Sample{Seconds: el.Seconds(), Committed: n, Applied: applied})
		b.line.set("  %s: %d/%d records committed, %.0f events applied/s", label, n, want,
			float64(applied)/float64(max(len(b.names), 1))/el.Seconds())
		if n >= want && (!storm || made.Load() > 0) {
			end := time.Now()
			if l := st.last.Load(); l > 0 {
				end = time.Unix(0, l)
			}
			return n, end, stop()
		}
		if n != last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) > stallAfter && !churning.Load() {
			return 0, time.Time{}, fmt.Errorf("%s: no record committed for %v (%d of %d): the members are stuck; see the log", label, stallAfter, n, want)
		}
	}
}
