package members

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// Tuned returns c with the group timings that make members join, leave
// and take over within seconds, as the demo, the benchmark and tests need:
// a 3s session, a 10s rebalance timeout, a 5s drain, heartbeats every 300ms and
// metadata refreshed after 100ms (an injected leader error otherwise costs
// 15s). Under processor.ConsumerProtocol the session timeout and the
// heartbeat interval are the broker's (group.consumer.session.timeout.ms,
// group.consumer.heartbeat.interval.ms), and only the rest applies.
func Tuned(c processor.Config) processor.Config {
	c.SessionTimeout, c.RebalanceTimeout, c.DrainTimeout = 3*time.Second, 10*time.Second, 5*time.Second
	c.HeartbeatInterval = 300 * time.Millisecond
	c.KafkaOptions = append(append([]kgo.Opt(nil), c.KafkaOptions...), kgo.MetadataMinAge(100*time.Millisecond))
	return c
}

// InProcessConfig is what every in-process member of a group shares.
type InProcessConfig struct {
	Pool *pgxpool.Pool
	// Consumer is every member's config, its GroupProtocol included.
	// ClientID is set to each member's name. InstanceID, if set, makes
	// the members static: each one's is InstanceID, "-" and its name, so
	// members differ, and a member started again under a name it had
	// keeps its place in the group.
	Consumer processor.Config
	Writer   sink.Config // Cache is made per member
	LRUSize  int         // of each member's dedup cache; 0 disables it
	// Kill makes Crash a SIGKILL's (processor.Consumer.Kill): the member
	// stays in the group until its session times out. Otherwise Crash
	// aborts it (processor.Consumer.Abort), and its client leaves the
	// group as it closes.
	Kill bool
	// Started, if set, is called with each member's consumer and cache
	// before the consumer runs (to add it to metrics, for example).
	Started func(*processor.Consumer, *dedup.Cache)
}

// InProcess returns a Starter of members that run in this process: each a
// processor.Consumer over its own sink.Writer and dedup cache.
func InProcess(cfg InProcessConfig) Starter {
	return func(ctx context.Context, name string) (Member, error) {
		cache, err := dedup.New(cfg.LRUSize)
		if err != nil {
			return nil, err
		}
		wc := cfg.Writer
		wc.Cache = cache
		w, err := sink.New(cfg.Pool, wc)
		if err != nil {
			return nil, err
		}
		cc := cfg.Consumer
		cc.ClientID = name
		if cc.InstanceID != "" {
			cc.InstanceID += "-" + name
		}
		c, err := processor.New(cc, w)
		if err != nil {
			return nil, err
		}
		if cfg.Started != nil {
			cfg.Started(c, cache)
		}
		m := Run(ctx, name, c).(*consumer)
		m.kill = cfg.Kill
		return m, nil
	}
}

// consumer is a Member running a processor.Consumer in this process.
type consumer struct {
	name   string
	c      *processor.Consumer
	cancel context.CancelFunc
	done   chan error // Run's result; buffered so Run's goroutine never waits
	kill   bool       // Crash kills rather than aborts

	once sync.Once
	err  error
}

// Run runs c in a goroutine the returned Member owns until Leave or Crash.
func Run(ctx context.Context, name string, c *processor.Consumer) Member {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m := &consumer{name: name, c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(rctx) }()
	return m
}

func (m *consumer) Name() string           { return m.name }
func (m *consumer) Stats() processor.Stats { return m.c.Stats() }

// Leave cancels Run's context (a drain) and waits for Run to return.
func (m *consumer) Leave() error {
	m.cancel()
	return m.wait()
}

// Crash kills the consumer (processor.Consumer.Kill) or aborts it
// (Abort), as InProcessConfig.Kill says, and waits for Run.
func (m *consumer) Crash() error {
	if m.kill {
		m.c.Kill()
	} else {
		m.c.Abort()
	}
	return m.wait()
}

func (m *consumer) wait() error {
	m.once.Do(func() {
		m.err = <-m.done
		m.cancel()
		if m.err != nil {
			m.err = fmt.Errorf("%s: %w", m.name, m.err)
		}
	})
	return m.err
}

// StoredOffsets reads the next offsets group's members stored in schema's
// sink_offsets for topic, by partition; with a topicID, only the rows
// written for that topic id count (a recreated topic's new incarnation).
// A row taken but never written (NULL next_offset) is absent.
func StoredOffsets(ctx context.Context, pool *pgxpool.Pool, schema, group, topic, topicID string) (map[int32]int64, error) {
	rows, err := pool.Query(ctx, `SELECT partition, next_offset FROM `+pgx.Identifier{schema, "sink_offsets"}.Sanitize()+
		` WHERE consumer_group = $1 AND topic = $2 AND next_offset IS NOT NULL AND ($3 = '' OR topic_id::text = $3)`, group, topic, topicID)
	if err != nil {
		return nil, fmt.Errorf("read sink_offsets: %w", err)
	}
	out := map[int32]int64{}
	var p int32
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { out[p] = n; return nil }); err != nil {
		return nil, fmt.Errorf("read sink_offsets: %w", err)
	}
	return out, nil
}

// Committed returns how many records of group have a committed batch in
// schema: the sum of the next offsets stored in sink_offsets, which for
// topics whose offsets start at 0 is the count of records consumed and
// committed. Partitions without a stored offset count nothing.
func Committed(ctx context.Context, pool *pgxpool.Pool, schema, group string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+
		pgx.Identifier{schema, "sink_offsets"}.Sanitize()+` WHERE consumer_group = $1`, group).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read committed offsets of group %s: %w", group, err)
	}
	return n, nil
}

// WaitCommitted polls Committed every poll until it reaches n, and returns
// nil then, or ctx's error.
func WaitCommitted(ctx context.Context, pool *pgxpool.Pool, schema, group string, n int64, poll time.Duration) error {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		got, err := Committed(ctx, pool, schema, group)
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("group %s committed %d of %d records: %w", group, got, n, ctx.Err())
		case <-t.C:
		}
	}
}
