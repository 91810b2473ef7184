package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/outbox"
	schemaregistry "github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/sink"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	var exit exitError
	switch {
	case errors.As(err, &exit):
		os.Exit(int(exit))
	case err != nil:
		fmt.Fprintln(os.Stderr, "onceflow:", err)
		os.Exit(1)
	}
}

// exitError ends the process with a status after the command has already
// said why.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// binds are the flags every command accepts, and the keys they set.
var binds = []config.Flag{
	{Name: "brokers", Key: "kafka.brokers"},
	{Name: "topics", Key: "kafka.topics"},
	{Name: "group", Key: "kafka.group"},
	{Name: "dsn", Key: "postgres.dsn"},
	{Name: "schema", Key: "postgres.schema"},
	{Name: "handlers", Key: "handlers"},
	{Name: "lru-size", Key: "dedup.lru_size"},
	{Name: "batch-max-records", Key: "batch.max_records"},
	{Name: "log-level", Key: "log.level"},
	{Name: "http-addr", Key: "http.addr"},
}

func addConfigFlags(fs *pflag.FlagSet) {
	fs.String("config", "", "YAML config file (see config.example.yaml)")
	fs.StringSlice("brokers", nil, "Kafka brokers, host:port[,host:port] (kafka.brokers)")
	fs.StringSlice("topics", nil, "topics to consume (kafka.topics)")
	fs.String("group", "", "consumer group (kafka.group)")
	fs.String("dsn", "", "Postgres connection string (postgres.dsn)")
	fs.String("schema", "", "Postgres schema for onceflow's tables (postgres.schema)")
	fs.StringSlice("handlers", nil, "handlers to run (handlers)")
	fs.Int("lru-size", 0, "dedup LRU size; 0 disables it (dedup.lru_size)")
	fs.Int("batch-max-records", 0, "records per batch at most (batch.max_records)")
	fs.String("log-level", "", "debug, info, warn or error (log.level)")
	fs.String("http-addr", "", "HTTP listen address for metrics, health and the API (http.addr)")
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "onceflow",
		Short: "Effectively-once effects in PostgreSQL from at-least-once Kafka",
		Long: `onceflow consumes Kafka topics in a consumer group and applies each event's
business effects in PostgreSQL exactly once, however often the broker
delivers it: one transaction per partition batch claims (event_id, handler)
rows in processed_events, applies the claimed events, stores the partition's
next offset, and commits; only then is the Kafka offset committed.

Configuration: a YAML file (--config), ONCEFLOW_* environment variables
(ONCEFLOW_POSTGRES_DSN, ONCEFLOW_KAFKA_BROKERS, ...), then flags.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	addConfigFlags(root.PersistentFlags())
	root.AddCommand(newRunCmd(), newBenchCmd(), newServeCmd(), newDemoCmd(), newMigrateCmd(), newAuditCmd(), newProduceCmd(), newReplayCmd(), newTraceCmd())
	return root
}

// app is what every command starts from: the loaded config and a logger.
type app struct {
	cfg     config.Config
	log     *slog.Logger
	tp      trace.TracerProvider // set by startTracing; nil until then
	tracing bool
	// kafkaSecurity are kafka.tls and kafka.sasl as client options; every
	// client of kafka.brokers takes them (kafkaOptions). They hold the
	// password: never log them.
	kafkaSecurity []kgo.Opt
	// schemas reads decode.format avro and protobuf (decode.schema_registry);
	// nil with json and bytes.
	schemas *schemaregistry.Decoder
}

func load(cmd *cobra.Command) (*app, error) { return loadBinding(cmd, binds) }

// loadBinding is load with the flags bs bound to keys: a command with a
// flag of its own that shadows one of binds leaves that one out.
func loadBinding(cmd *cobra.Command, bs []config.Flag) (*app, error) {
	file, _ := cmd.Flags().GetString("config")
	cfg, err := config.Load(file, cmd.Flags(), bs, config.Default{Key: "handlers", Value: registry.names})
	// The handlers' names are checked with the rest, so that every problem
	// shows at once (a key that did not decode is empty: nothing to check).
	err = errors.Join(err, registry.check(cfg.Handlers))
	if err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	security, err := cfg.Kafka.ClientOptions()
	if err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	a := &app{cfg: cfg, log: newLogger(cfg.Log), kafkaSecurity: security}
	if a.schemas, err = newSchemaDecoder(cfg.Decode); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return a, nil
}

func newLogger(c config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if c.Format == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	return slog.New(traceHandler{h})
}

// openPool connects to Postgres and pings it, with an error that says how to
// start the local database when it does not answer.
func (a *app) openPool(ctx context.Context, size int) (*pgxpool.Pool, error) {
	pool, err := a.newPool(size)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		if why := postgresTLSProblem(err); why != "" {
			return nil, fmt.Errorf("postgres at %s: %s: %s", config.RedactDSN(a.cfg.Postgres.DSN), why, redactErr(err, a.cfg.Postgres.DSN))
		}
		return nil, fmt.Errorf("postgres at %s does not answer (%v)\n  start the local cluster with: infra/postgres.sh start",
			config.RedactDSN(a.cfg.Postgres.DSN), redactErr(err, a.cfg.Postgres.DSN))
	}
	return pool, nil
}

// withPool loads the config and runs f with a one-connection pool, closed
// after: the short commands' frame.
func withPool(cmd *cobra.Command, f func(*app, *pgxpool.Pool) error) error {
	a, err := load(cmd)
	if err != nil {
		return err
	}
	pool, err := a.openPool(cmd.Context(), 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	return f(a, pool)
}

// redactErr removes the DSN's password from an error message.
func redactErr(err error, dsn string) string {
	msg := err.Error()
	if pc, perr := pgxpool.ParseConfig(dsn); perr == nil && pc.ConnConfig.Password != "" {
		msg = strings.ReplaceAll(msg, pc.ConnConfig.Password, "xxxxx")
	}
	return msg
}

// migrate creates sink's tables, the outbox and the orders table (the
// producer side of serve, whose API writes an order and its outbox row
// whichever handlers are configured) and those of the configured handlers
// in schema.
func (a *app) migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := sink.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if err := orders.MigrateProducer(ctx, pool, schema); err != nil {
		return err
	}
	return registry.migrator(a.cfg.Handlers)(ctx, pool, schema)
}
