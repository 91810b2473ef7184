package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// Options are the demo's knobs; the errors of Validate name their flags.
type Options struct {
	Events         int           // unique order events
	Duplicates     float64       // redeliveries per event among them
	Replay         float64       // fraction of the events published again at the end
	Partitions     int           // of the demo topic
	Members        int           // running at once
	RebalanceEvery time.Duration // how often one member is replaced
	Schema         string        // dropped and recreated
	Seed           uint64        // of the generated events
	Timeout        time.Duration // give up after
}

// Validate returns every problem with o, each naming its flag.
func (o Options) Validate() error {
	var ps []error
	bad := func(format string, args ...any) { ps = append(ps, fmt.Errorf(format, args...)) }
	if o.Events < 1 {
		bad("--events %d: must be at least 1", o.Events)
	}
	if o.Duplicates < 0 || o.Duplicates > 10 {
		bad("--duplicates %v: must be 0..10", o.Duplicates)
	}
	if o.Replay < 0 || o.Replay > 1 {
		bad("--replay %v: must be 0..1", o.Replay)
	}
	if o.Partitions < 1 || o.Partitions > 1000 {
		bad("--partitions %d: must be 1..1000", o.Partitions)
	}
	if o.Members < 1 || o.Members > 100 {
		bad("--members %d: must be 1..100", o.Members)
	}
	if o.RebalanceEvery < 100*time.Millisecond {
		bad("--rebalance-every %v: must be at least 100ms", o.RebalanceEvery)
	}
	if o.Timeout <= 4*o.RebalanceEvery {
		bad("--timeout %v: must be longer than four --rebalance-every (%v), over which the stream is published", o.Timeout, o.RebalanceEvery)
	}
	if !identifier.MatchString(o.Schema) || o.Schema == "public" {
		bad("--demo-schema %q: must be a lower-case identifier other than public (the demo drops it)", o.Schema)
	}
	return errors.Join(ps...)
}

// identifier is a lower-case SQL identifier that needs no quoting.
var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Env is what the program running the demo wires in.
type Env struct {
	Pool *pgxpool.Pool
	// Migrate creates every table the demo writes to in a schema: sink's
	// and the orders business's.
	Migrate func(ctx context.Context, pool *pgxpool.Pool, schema string) error
	// Consumer and Writer are each member's configs; the demo sets the
	// brokers, the topic and the group timings. Writer.Handlers must
	// write to Options.Schema.
	Consumer processor.Config
	Writer   sink.Config
	LRUSize  int
	// Handlers are the names of Writer.Handlers, which Check verifies.
	Handlers []string
	// DeadLetterTopic, when set, is created in the embedded Kafka and
	// receives the dead letters' copies; empty, they stay in the
	// dead_letters table only.
	DeadLetterTopic string
	ProducerOptions []kgo.Opt // for the demo's producer (tracing)
	// Started, if set, sees each member's consumer and cache (metrics).
	Started  func(*processor.Consumer, *dedup.Cache)
	Progress io.Writer // progress lines; nil discards
}

// ErrInterrupted is returned when ctx ends before the demo finished.
var ErrInterrupted = errors.New("demo interrupted")

// Run runs the demo and returns its summary, read back from Postgres. A
// summary whose ExactlyOnce is false is not an error. Every goroutine it
// starts has stopped when it returns.
func Run(ctx context.Context, env Env, o Options) (Summary, error) {
	start := time.Now()
	if err := o.Validate(); err != nil {
		return Summary{}, err
	}
	if env.Progress == nil {
		env.Progress = io.Discard
	}
	if err := reset(ctx, env, o.Schema); err != nil {
		return Summary{}, err
	}
	topic := env.Consumer.Topics[0]
	kopts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(int32(o.Partitions), topic),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond)}
	if env.DeadLetterTopic != "" {
		kopts = append(kopts, kfake.SeedTopics(1, env.DeadLetterTopic))
	}
	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		return Summary{}, fmt.Errorf("embedded kafka: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	stream, err := orders.Generate(o.Events, o.Duplicates, o.Seed)
	if err != nil {
		return Summary{}, err
	}
	replay := replaySet(stream, int(float64(o.Events)*o.Replay))
	total := int64(len(stream.Messages) + len(replay))
	progress(env.Progress, "onceflow demo: embedded Kafka at %s, topic %s with %d partitions; Postgres schema %s",
		brokers[0], topic, o.Partitions, o.Schema)
	progress(env.Progress, "publishing %d records: %d unique order events, %d redeliveries among them, then a replay of %d",
		total, o.Events, len(stream.Messages)-o.Events, len(replay))

	pub := startPublishing(ctx, brokers, topic, stream.Messages, replay, publishGap(o.RebalanceEvery), env.ProducerOptions)
	defer pub.stop()
	g := members.NewGroup(members.InProcess(members.InProcessConfig{Pool: env.Pool, Consumer: memberConfig(env, brokers),
		Writer: env.Writer, LRUSize: env.LRUSize, Started: env.Started}))
	defer func() { _ = g.StopAll() }()
	for range o.Members {
		if _, err := g.Start(ctx); err != nil {
			return Summary{}, err
		}
	}
	w := &watch{env: env, o: o, g: g, pub: pub, total: total, start: start}
	if err := w.run(ctx); err != nil {
		return Summary{}, err
	}
	if err := g.StopAll(); err != nil {
		return Summary{}, err
	}
	return summarize(ctx, env, o, g, stream, len(replay), start)
}

// reset drops the demo's schema and creates its tables anew.
func reset(ctx context.Context, env Env, schema string) error {
	if _, err := env.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("reset schema %s: %w", schema, err)
	}
	return env.Migrate(ctx, env.Pool, schema)
}

// replaySet is the first n distinct events of the stream, once each.
func replaySet(s orders.Stream, n int) []orders.Message {
	var replay []orders.Message
	for _, m := range s.Messages {
		if len(replay) >= n {
			break
		}
		if len(replay) == 0 || replay[len(replay)-1].ID != m.ID {
			replay = append(replay, m)
		}
	}
	return replay
}

// memberConfig is env's consumer config on brokers, tuned for fast
// rebalances.
func memberConfig(env Env, brokers []string) processor.Config {
	c := members.Tuned(env.Consumer)
	c.Brokers = brokers
	return c
}

func progress(w io.Writer, format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
