package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// EnvPrefix prefixes every environment variable: kafka.brokers is
// ONCEFLOW_KAFKA_BROKERS.
const EnvPrefix = "ONCEFLOW"

// Config is every setting of onceflow. The `mapstructure` tags are the keys.
type Config struct {
	Kafka    Kafka    `mapstructure:"kafka"`
	Batch    Batch    `mapstructure:"batch"`
	Decode   Decode   `mapstructure:"decode"`
	Postgres Postgres `mapstructure:"postgres"`
	Dedup    Dedup    `mapstructure:"dedup"`
	Handlers []string `mapstructure:"handlers"`
	Bus      string   `mapstructure:"bus"`
	Log      Log      `mapstructure:"log"`
	HTTP     HTTP     `mapstructure:"http"`
	// SQLHandlers are handlers written in SQL, applied besides Handlers.
	SQLHandlers []SQLHandler `mapstructure:"sql_handlers"`
	// DrainTimeout bounds finishing in-flight batches on SIGTERM or a
	// revoke; what is left is then aborted (rolled back), but for a
	// COMMIT already sent, whose answer is waited for within
	// postgres.tx_timeout.
	DrainTimeout time.Duration `mapstructure:"drain_timeout"`
}

// Kafka is the consumer side.
type Kafka struct {
	Brokers          []string      `mapstructure:"brokers"`
	Topics           []string      `mapstructure:"topics"`
	Group            string        `mapstructure:"group"`
	ClientID         string        `mapstructure:"client_id"`
	DeadLetterTopic  string        `mapstructure:"dead_letter_topic"`
	SessionTimeout   time.Duration `mapstructure:"session_timeout"`
	RebalanceTimeout time.Duration `mapstructure:"rebalance_timeout"`
	CommitInterval   time.Duration `mapstructure:"commit_interval"`
	ProduceTimeout   time.Duration `mapstructure:"produce_timeout"`
	OffsetOutOfRange string        `mapstructure:"offset_out_of_range"`
	// HeartbeatInterval is a classic member's; unset, a third of
	// SessionTimeout, at most 3s (see processor.Config).
	HeartbeatInterval time.Duration `mapstructure:"heartbeat_interval"`
	// GroupProtocol is classic or consumer (KIP-848); InstanceID, if set,
	// makes the member static (KIP-345). See processor.Config.
	GroupProtocol string `mapstructure:"group_protocol"`
	InstanceID    string `mapstructure:"instance_id"`
	// TLS and SASL reach a secured cluster (security.go).
	TLS  KafkaTLS  `mapstructure:"tls"`
	SASL KafkaSASL `mapstructure:"sasl"`

	// FetchMaxBytes and FetchMaxPartitionBytes bound one fetch response
	// per broker and one partition's share of it: with the queues
	// (batch.*), what bounds a member's memory.
	FetchMaxBytes          int `mapstructure:"fetch_max_bytes"`
	FetchMaxPartitionBytes int `mapstructure:"fetch_max_partition_bytes"`
}

// Batch says when a partition's batch closes.
type Batch struct {
	MaxRecords int           `mapstructure:"max_records"`
	MaxBytes   int           `mapstructure:"max_bytes"`
	Linger     time.Duration `mapstructure:"linger"`
	// RetryBackoff is the first wait before a failed batch is retried,
	// doubling up to MaxRetryBackoff.
	RetryBackoff    time.Duration `mapstructure:"retry_backoff"`
	MaxRetryBackoff time.Duration `mapstructure:"max_retry_backoff"`
}

// Decode says how values are read, where the event id is and how large a
// record may be.
type Decode struct {
	Format         string `mapstructure:"format"`          // json, bytes, avro or protobuf
	EventIDSource  string `mapstructure:"event_id_source"` // header, field, key or offset
	EventIDHeader  string `mapstructure:"event_id_header"`
	EventIDField   string `mapstructure:"event_id_field"`
	MaxRecordBytes int    `mapstructure:"max_record_bytes"`
	// SchemaRegistry is where avro and protobuf find their schemas
	// (registry.go).
	SchemaRegistry SchemaRegistry `mapstructure:"schema_registry"`
}

// SQLHandler is one item of sql_handlers: a handler whose effects are one
// SQL statement per batch over the relation events (see sink.SQLHandler).
type SQLHandler struct {
	Name   string   `mapstructure:"name"`   // its processed_events.handler value
	SQL    string   `mapstructure:"sql"`    // one statement
	Topics []string `mapstructure:"topics"` // empty: every topic of kafka.topics
}

// Postgres is the sink.
type Postgres struct {
	DSN string `mapstructure:"dsn"`
	// DSNFile is a file holding the DSN, read into DSN by Load
	// (security.go). TLS is the DSN's: sslmode=verify-full&sslrootcert=….
	DSNFile   string        `mapstructure:"dsn_file"`
	Schema    string        `mapstructure:"schema"`
	PoolSize  int           `mapstructure:"pool_size"`
	TxTimeout time.Duration `mapstructure:"tx_timeout"`
	// IdleTimeout bounds how long a batch's transaction stays open while
	// its member sends nothing (a stopped process holding row locks).
	IdleTimeout time.Duration `mapstructure:"idle_in_transaction_timeout"`
	// CallTimeout bounds every Postgres call outside batch transactions.
	CallTimeout time.Duration `mapstructure:"call_timeout"`
}

// Dedup sizes the LRU fast path and sets the dedup horizon.
type Dedup struct {
	LRUSize int `mapstructure:"lru_size"`
	// Retention is the dedup horizon: claims are kept at least this long,
	// then dropped a slice at a time; 0 keeps them forever.
	Retention time.Duration `mapstructure:"retention"`
	// RetentionSlices is how many slices one horizon spans.
	RetentionSlices int `mapstructure:"retention_slices"`
}

// Log configures log/slog output on stderr.
type Log struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
}

// HTTP is the listen address of the HTTP server (metrics, health, API).
type HTTP struct {
	Addr string `mapstructure:"addr"`
}

// DefaultDSN is the database infra/postgres.sh creates.
// DefaultRetention is dedup.retention's default, a week: Kafka's default
// retention.ms, so that by default nothing the brokers can still deliver
// is older than the horizon.
const DefaultRetention = 7 * 24 * time.Hour

const DefaultDSN = "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow?sslmode=disable"

// defaults has a value for every key; it is also the list of known keys.
var defaults = map[string]any{
	"kafka.brokers":                        []string{"127.0.0.1:9092"},
	"kafka.topics":                         []string{"orders"},
	"kafka.group":                          "onceflow",
	"kafka.client_id":                      processor.DefaultClientID,
	"kafka.dead_letter_topic":              "", // none: dead letters in the table only; a topic named must exist
	"kafka.session_timeout":                processor.DefaultSessionTimeout,
	"kafka.rebalance_timeout":              processor.DefaultRebalanceTimeout,
	"kafka.heartbeat_interval":             processor.DefaultHeartbeatInterval, // unset: a third of a session shorter than 9s
	"kafka.commit_interval":                processor.DefaultCommitInterval,
	"kafka.produce_timeout":                processor.DefaultProduceTimeout,
	"kafka.offset_out_of_range":            string(processor.DefaultOffsetOutOfRange),
	"kafka.group_protocol":                 string(processor.DefaultGroupProtocol),
	"kafka.instance_id":                    "",
	"batch.max_records":                    processor.DefaultBatchMaxRecords,
	"batch.max_bytes":                      processor.DefaultBatchMaxBytes,
	"batch.linger":                         processor.DefaultBatchLinger,
	"batch.retry_backoff":                  processor.DefaultRetryBackoff,
	"batch.max_retry_backoff":              processor.DefaultMaxRetryBackoff,
	"drain_timeout":                        processor.DefaultDrainTimeout,
	"decode.format":                        string(processor.FormatJSON),
	"decode.event_id_source":               string(processor.IDFromHeader),
	"decode.event_id_header":               processor.HeaderEventID,
	"decode.event_id_field":                "",
	"decode.max_record_bytes":              1 << 20,
	"postgres.dsn":                         DefaultDSN,
	"postgres.schema":                      sink.DefaultSchema,
	"postgres.pool_size":                   4,
	"postgres.tx_timeout":                  sink.DefaultTxTimeout,
	"postgres.idle_in_transaction_timeout": sink.DefaultIdleTimeout,
	"postgres.call_timeout":                processor.DefaultCallTimeout,
	"dedup.lru_size":                       100000,
	"dedup.retention":                      DefaultRetention,
	"dedup.retention_slices":               dedup.DefaultRetentionSlices,
	"handlers":                             []string{}, // the program's Default: every Go handler it registers
	"sql_handlers":                         []map[string]any{},
	"bus":                                  "kafka",
	"log.level":                            "info",
	"log.format":                           "text",
	"http.addr":                            "127.0.0.1:8080",

	// Fetch sizes bound a member's memory (processor doc, "Memory").
	"kafka.fetch_max_bytes":           processor.DefaultFetchMaxBytes,
	"kafka.fetch_max_partition_bytes": processor.DefaultFetchMaxPartitionBytes,
}

// Keys returns every configuration key, sorted.
func Keys() []string {
	keys := make([]string, 0, len(defaults))
	for k := range defaults {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// EnvName is the environment variable for key.
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Flag binds a command-line flag to a key.
type Flag struct {
	Name string // flag name, without dashes
	Key  string
}

// Default replaces the default of a key with the program's own, such as
// the names of the handlers it registers for "handlers".
type Default struct {
	Key   string
	Value any
}

// Load builds the Config. file is a YAML file ("" for none); flags, if not
// nil, override keys through binds for the flags the user set; defs replace
// defaults. It returns every problem at once: unknown keys in the file or
// environment, values of the wrong type, and everything Validate finds.
func Load(file string, flags *pflag.FlagSet, binds []Flag, defs ...Default) (Config, error) {
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	var problems []error
	for _, d := range defs {
		if _, ok := defaults[d.Key]; !ok {
			problems = append(problems, fmt.Errorf("default for %s: no such setting", d.Key))
			continue
		}
		v.SetDefault(d.Key, d.Value)
	}
	if file != "" {
		v.SetConfigFile(file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", file, err)
		}
	}
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	problems = append(problems, unknownEnv()...)
	for _, b := range binds {
		if flags == nil {
			break
		}
		if f := flags.Lookup(b.Name); f != nil {
			if err := v.BindPFlag(b.Key, f); err != nil {
				problems = append(problems, fmt.Errorf("flag --%s: %w", b.Name, err))
			}
		}
	}
	var cfg Config
	err := v.UnmarshalExact(&cfg, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		numberAsDuration,
		mapstructure.StringToTimeDurationHookFunc(),
		mapstructure.StringToSliceHookFunc(","),
	)))
	if err == nil && len(cfg.SQLHandlers) > 0 && !explicit(v, flags, binds, "handlers") {
		// The program's default handlers run only where the user
		// configured no handler at all.
		cfg.Handlers = nil
	}
	if err == nil && cfg.Postgres.IdleTimeout > cfg.Postgres.TxTimeout && !explicit(v, flags, binds, "postgres.idle_in_transaction_timeout") {
		// The default idle bound (5s) yields to a shorter tx_timeout: a
		// user who shortens one key is not refused on another.
		cfg.Postgres.IdleTimeout = cfg.Postgres.TxTimeout
	}
	if err == nil && !explicit(v, flags, binds, "kafka.heartbeat_interval") && cfg.Kafka.SessionTimeout > 0 {
		// The default heartbeat (3s) yields to a shorter session: a
		// member heartbeats three times per session, or it loses it
		// between two heartbeats.
		cfg.Kafka.HeartbeatInterval = min(cfg.Kafka.HeartbeatInterval, cfg.Kafka.SessionTimeout/3)
	}
	if err != nil {
		// The keys that did decode are still checked, so that every
		// problem shows at once; a key that did not decode holds its zero
		// value, whose own complaints would only mislead.
		failed := unmarshalProblems(err, func(key string) string { return source(flags, binds, file, key) })
		problems = append(problems, failed...)
		problems = append(problems, cfg.readSecretFiles()...)
		problems = append(problems, cfg.readRegistryPassword()...)
		problems = append(problems, withoutKeysIn(cfg.Validate(), failed)...)
	} else {
		problems = append(problems, cfg.readSecretFiles()...)
		problems = append(problems, cfg.readRegistryPassword()...)
		if err := cfg.Validate(); err != nil {
			problems = append(problems, err)
		}
	}
	return cfg, errors.Join(problems...)
}

// withoutKeysIn returns the problems of err, as Validate joins them (each
// "key: …"), but those about a key quoted in one of failed ('key', as
// the decoder names the keys it could not decode).
func withoutKeysIn(err error, failed []error) []error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if err == nil {
			return nil
		}
		return []error{err}
	}
	var out []error
	for _, p := range joined.Unwrap() {
		key, _, _ := strings.Cut(p.Error(), ":")
		quoted := false
		for _, f := range failed {
			if strings.Contains(f.Error(), "'"+key+"'") || strings.Contains(f.Error(), "'"+key+".") || strings.Contains(f.Error(), "'"+key+"[") {
				quoted = true
				break
			}
		}
		if !quoted {
			out = append(out, p)
		}
	}
	return out
}

// numberAsDuration refuses a bare number for a duration (YAML's
// `retention: 604800` would otherwise be 604800 nanoseconds); 0 is
// allowed, as "none".
func numberAsDuration(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeOf(time.Duration(0)) || from == to {
		return data, nil
	}
	switch from.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		if reflect.ValueOf(data).IsZero() {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("%v is a number without a unit: write a duration like 168h, 30s or 500ms", data)
	}
	return data, nil
}

// explicit reports whether the user set key: in the file, the environment
// or a flag, rather than leaving it to a default.
func explicit(v *viper.Viper, flags *pflag.FlagSet, binds []Flag, key string) bool {
	if v.InConfig(key) {
		return true
	}
	if _, ok := os.LookupEnv(EnvName(key)); ok {
		return true
	}
	for _, b := range binds {
		if b.Key == key && flags != nil {
			if f := flags.Lookup(b.Name); f != nil && f.Changed {
				return true
			}
		}
	}
	return false
}

// unknownEnv reports ONCEFLOW_* variables that name no key (ONCEFLOW_TEST_*
// belong to the test suite and are ignored).
func unknownEnv() []error {
	known := map[string]bool{}
	for k := range defaults {
		known[EnvName(k)] = true
	}
	var problems []error
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix+"_") && !strings.HasPrefix(name, EnvPrefix+"_TEST_") && !known[name] {
			problems = append(problems, fmt.Errorf("environment %s: no such setting (every key is in config.example.yaml)", name))
		}
	}
	return problems
}

// unmarshalProblems turns mapstructure's joined errors into one error per
// problem, naming the file.
func unmarshalProblems(err error, where func(key string) string) []error {
	var out []error
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "*"))
		if line == "" || strings.HasPrefix(line, "decoding failed due to") || strings.HasSuffix(line, "error(s) decoding:") {
			continue
		}
		key := ""
		if m := quotedKey.FindStringSubmatch(line); m != nil {
			key = m[1]
		}
		out = append(out, fmt.Errorf("%s: %s", where(key), line))
	}
	if len(out) == 0 {
		out = append(out, fmt.Errorf("%s: %w", where(""), err))
	}
	return out
}

// quotedKey finds the key a decoding error quotes: 'batch.max_records'.
var quotedKey = regexp.MustCompile(`'([a-z0-9_.]+)`)

// source names where key's value came from, as viper ranks them: a flag
// set on the command line, else its ONCEFLOW_* variable, else the config
// file (or "config" when there is none, or key is unknown).
func source(flags *pflag.FlagSet, binds []Flag, file, key string) string {
	if key != "" {
		for _, b := range binds {
			if b.Key == key && flags != nil {
				if f := flags.Lookup(b.Name); f != nil && f.Changed {
					return "flag --" + b.Name
				}
			}
		}
		if _, ok := os.LookupEnv(EnvName(key)); ok {
			return "environment " + EnvName(key)
		}
	}
	if file != "" {
		return "config file " + file
	}
	return "config"
}

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// IsIdentifier reports whether s is a lower-case SQL identifier that needs
// no quoting, as postgres.schema must be.
func IsIdentifier(s string) bool { return identifier.MatchString(s) }

// Validate returns every problem with c, each naming its key. It never
// includes a password in its messages. It is long on purpose: one check
// per key, in the keys' order, so that a key's rule is found by its name.
func (c Config) Validate() error {
	var ps []error
	bad := func(key, format string, args ...any) {
		ps = append(ps, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if len(c.Kafka.Brokers) == 0 {
		bad("kafka.brokers", "at least one broker is required")
	}
	for _, b := range c.Kafka.Brokers {
		if err := checkHostPort(b, 1); err != nil {
			bad("kafka.brokers", "%q is not host:port: %v", b, err)
		}
	}
	if len(c.Kafka.Topics) == 0 {
		bad("kafka.topics", "at least one topic is required")
	}
	for _, t := range c.Kafka.Topics {
		if !validTopic(t) {
			bad("kafka.topics", "%q is not a valid topic name (1-249 of [a-zA-Z0-9._-])", t)
		}
	}
	if c.Kafka.DeadLetterTopic != "" && !validTopic(c.Kafka.DeadLetterTopic) {
		bad("kafka.dead_letter_topic", "%q is not a valid topic name", c.Kafka.DeadLetterTopic)
	}
	if slices.Contains(c.Kafka.Topics, c.Kafka.DeadLetterTopic) {
		bad("kafka.dead_letter_topic", "%q is also a consumed topic", c.Kafka.DeadLetterTopic)
	}
	if c.Kafka.Group == "" {
		bad("kafka.group", "is required")
	}
	ps = append(ps, c.Kafka.validateSecurity()...)
	if c.Kafka.SessionTimeout < 100*time.Millisecond {
		bad("kafka.session_timeout", "%v is below 100ms", c.Kafka.SessionTimeout)
	}
	if c.Kafka.HeartbeatInterval <= 0 {
		bad("kafka.heartbeat_interval", "must be positive, got %v", c.Kafka.HeartbeatInterval)
	} else if c.Kafka.SessionTimeout > 0 && c.Kafka.HeartbeatInterval > c.Kafka.SessionTimeout/3 {
		bad("kafka.heartbeat_interval", "%v is above a third of kafka.session_timeout %v (%v): a classic member would lose its session between heartbeats",
			c.Kafka.HeartbeatInterval, c.Kafka.SessionTimeout, c.Kafka.SessionTimeout/3)
	}
	if c.Kafka.RebalanceTimeout < c.Kafka.SessionTimeout {
		bad("kafka.rebalance_timeout", "%v is shorter than kafka.session_timeout %v", c.Kafka.RebalanceTimeout, c.Kafka.SessionTimeout)
	}
	if c.Kafka.CommitInterval < 100*time.Millisecond { // franz-go's autocommit floor
		bad("kafka.commit_interval", "%v is below 100ms", c.Kafka.CommitInterval)
	}
	if c.Kafka.ProduceTimeout <= 0 {
		bad("kafka.produce_timeout", "must be positive, got %v", c.Kafka.ProduceTimeout)
	}
	if o := processor.OutOfRange(c.Kafka.OffsetOutOfRange); o != processor.ResumeAtLogStart && o != processor.PauseOnOutOfRange {
		bad("kafka.offset_out_of_range", "%q is not %s or %s", c.Kafka.OffsetOutOfRange, processor.ResumeAtLogStart, processor.PauseOnOutOfRange)
	}
	if p := processor.GroupProtocol(c.Kafka.GroupProtocol); p != processor.ClassicProtocol && p != processor.ConsumerProtocol {
		bad("kafka.group_protocol", "%q is not %s or %s", c.Kafka.GroupProtocol, processor.ClassicProtocol, processor.ConsumerProtocol)
	}
	if err := processor.CheckInstanceID(c.Kafka.InstanceID); err != nil {
		bad("kafka.instance_id", "%v", err)
	}
	if c.Kafka.FetchMaxBytes < 1024 || c.Kafka.FetchMaxBytes > processor.MaxFetchBytes {
		bad("kafka.fetch_max_bytes", "must be 1024..%d, got %d", processor.MaxFetchBytes, c.Kafka.FetchMaxBytes)
	}
	if c.Kafka.FetchMaxPartitionBytes < 1024 || c.Kafka.FetchMaxPartitionBytes > c.Kafka.FetchMaxBytes {
		bad("kafka.fetch_max_partition_bytes", "must be 1024..kafka.fetch_max_bytes (%d), got %d", c.Kafka.FetchMaxBytes, c.Kafka.FetchMaxPartitionBytes)
	}
	if c.DrainTimeout <= 0 || c.DrainTimeout >= c.Kafka.RebalanceTimeout {
		bad("drain_timeout", "must be positive and shorter than kafka.rebalance_timeout %v (a revoke must finish within the rebalance), got %v",
			c.Kafka.RebalanceTimeout, c.DrainTimeout)
	}
	if c.Batch.MaxRecords < 1 || c.Batch.MaxRecords > processor.MaxBatchRecords {
		bad("batch.max_records", "must be 1..%d, got %d", processor.MaxBatchRecords, c.Batch.MaxRecords)
	}
	if c.Batch.MaxBytes < 1024 {
		bad("batch.max_bytes", "must be at least 1024, got %d", c.Batch.MaxBytes)
	}
	if c.Batch.Linger < 0 || c.Batch.Linger > time.Minute {
		bad("batch.linger", "must be 0..1m, got %v", c.Batch.Linger)
	}
	if c.Batch.RetryBackoff <= 0 {
		bad("batch.retry_backoff", "must be positive, got %v", c.Batch.RetryBackoff)
	}
	if c.Batch.MaxRetryBackoff < c.Batch.RetryBackoff {
		bad("batch.max_retry_backoff", "%v is shorter than batch.retry_backoff %v", c.Batch.MaxRetryBackoff, c.Batch.RetryBackoff)
	}
	if c.Decode.Format != string(processor.FormatJSON) && c.Decode.Format != string(processor.FormatBytes) && !framed(c.Decode.Format) {
		bad("decode.format", "%q is not %s, %s, %s or %s", c.Decode.Format, processor.FormatJSON, processor.FormatBytes,
			processor.FormatAvro, processor.FormatProtobuf)
	}
	ps = append(ps, c.Decode.validateRegistry()...)
	switch src := processor.IDSource(c.Decode.EventIDSource); src {
	case processor.IDFromHeader, processor.IDFromKey, processor.IDFromOffset:
		if src == processor.IDFromHeader && c.Decode.EventIDHeader == "" {
			bad("decode.event_id_header", "is required with decode.event_id_source %s", src)
		}
		if c.Decode.EventIDField != "" {
			bad("decode.event_id_field", "%q is set but decode.event_id_source is %s (set event_id_source: field to read the id from the JSON value)",
				c.Decode.EventIDField, src)
		}
	case processor.IDFromField:
		if c.Decode.EventIDField == "" {
			bad("decode.event_id_field", "is required with decode.event_id_source %s", src)
		}
		if c.Decode.Format == string(processor.FormatBytes) {
			bad("decode.event_id_source", "%s needs decode.format json, avro or protobuf, not bytes", src)
		}
	default:
		bad("decode.event_id_source", "%q is not one of header, field, key, offset", c.Decode.EventIDSource)
	}
	if c.Decode.MaxRecordBytes < 1 {
		bad("decode.max_record_bytes", "must be positive, got %d", c.Decode.MaxRecordBytes)
	}
	if _, err := pgx.ParseConfig(c.Postgres.DSN); err != nil {
		if why := dsnTLSProblem(err); why != "" {
			bad("postgres.dsn", "%s: %s", RedactDSN(c.Postgres.DSN), why)
		} else {
			bad("postgres.dsn", "%s is not a valid connection string (postgres://user:password@host:port/db?sslmode=disable)", RedactDSN(c.Postgres.DSN))
		}
	}
	if !IsIdentifier(c.Postgres.Schema) {
		bad("postgres.schema", "%q is not a lower-case SQL identifier", c.Postgres.Schema)
	}
	if c.Postgres.PoolSize < 1 {
		bad("postgres.pool_size", "must be at least 1, got %d", c.Postgres.PoolSize)
	}
	if c.Postgres.IdleTimeout <= 0 || c.Postgres.IdleTimeout > c.Postgres.TxTimeout {
		bad("postgres.idle_in_transaction_timeout", "must be positive and at most postgres.tx_timeout %v, got %v",
			c.Postgres.TxTimeout, c.Postgres.IdleTimeout)
	}
	if c.Postgres.TxTimeout <= 0 {
		bad("postgres.tx_timeout", "must be positive, got %v", c.Postgres.TxTimeout)
	}
	if c.Postgres.CallTimeout <= 0 {
		bad("postgres.call_timeout", "must be positive, got %v", c.Postgres.CallTimeout)
	}
	if c.Dedup.LRUSize < 0 {
		bad("dedup.lru_size", "must be >= 0 (0 disables the cache), got %d", c.Dedup.LRUSize)
	}
	if c.Dedup.Retention < 0 || (c.Dedup.Retention > 0 && c.Dedup.Retention < time.Second) {
		bad("dedup.retention", "must be 0 (keep the dedup state forever) or at least 1s, got %v", c.Dedup.Retention)
	}
	if c.Dedup.RetentionSlices < 1 || c.Dedup.RetentionSlices > dedup.MaxRetentionSlices {
		bad("dedup.retention_slices", "must be between 1 and %d, got %d", dedup.MaxRetentionSlices, c.Dedup.RetentionSlices)
	}
	// Which names exist is the program's to say, where it builds the
	// handlers; here only the list's shape.
	if len(c.Handlers) == 0 && len(c.SQLHandlers) == 0 {
		bad("handlers", "at least one handler is required (in handlers or sql_handlers)")
	}
	seen := map[string]bool{}
	for _, h := range c.Handlers {
		switch {
		case h == "":
			bad("handlers", "a handler name is empty")
		case seen[h]:
			bad("handlers", "handler %q listed twice", h)
		}
		seen[h] = true
	}
	for i, h := range c.SQLHandlers {
		key := fmt.Sprintf("sql_handlers[%d]", i)
		switch {
		case h.Name == "":
			bad(key+".name", "is required")
		case slices.Contains(c.Handlers, h.Name):
			bad(key+".name", "%q is also in handlers: names are unique across handlers and sql_handlers", h.Name)
		case seen[h.Name]:
			bad(key+".name", "%q is used twice", h.Name)
		}
		seen[h.Name] = true
		if strings.TrimSpace(h.SQL) == "" {
			bad(key+".sql", "is required: one SQL statement over the relation events")
		}
		for _, t := range h.Topics {
			if !slices.Contains(c.Kafka.Topics, t) {
				bad(key+".topics", "%q is not a consumed topic (kafka.topics: %s)", t, strings.Join(c.Kafka.Topics, ", "))
			}
		}
	}
	if len(c.Handlers) == 0 && len(c.SQLHandlers) > 0 {
		for _, t := range c.Kafka.Topics {
			if !slices.ContainsFunc(c.SQLHandlers, func(h SQLHandler) bool { return len(h.Topics) == 0 || slices.Contains(h.Topics, t) }) {
				bad("kafka.topics", "no handler consumes %q: its records would be skipped (add it to an sql_handlers item's topics)", t)
			}
		}
	}
	if c.Bus == "" {
		bad("bus", "is required")
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	if !slices.Contains([]string{"text", "json"}, c.Log.Format) {
		bad("log.format", "%q is not text or json", c.Log.Format)
	}
	if c.HTTP.Addr != "" {
		if err := checkHostPort(c.HTTP.Addr, 0); err != nil { // port 0: any free port
			bad("http.addr", "%q is not host:port: %v", c.HTTP.Addr, err)
		}
	}
	return errors.Join(ps...)
}

func checkHostPort(s string, minPort int) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if strings.ContainsAny(host, "/ ") {
		return fmt.Errorf("bad host %q", host)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < minPort || n > 65535 {
		return fmt.Errorf("port %q is not %d..65535", port, minPort)
	}
	return nil
}

var topicChars = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func validTopic(t string) bool { return topicChars.MatchString(t) && t != "." && t != ".." }

// RedactDSN returns dsn with any password replaced by "xxxxx", for logs and
// errors: the URL's user password and the password and sslpassword
// parameters. TLS parameters (sslmode, sslrootcert) are kept.
func RedactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			}
		}
		if q := u.Query(); q.Has("password") || q.Has("sslpassword") {
			for _, k := range []string{"password", "sslpassword"} {
				if q.Has(k) {
					q.Set(k, "xxxxx")
				}
			}
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	dsn = urlPassword.ReplaceAllString(dsn, "${1}xxxxx@")
	return kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
}

var (
	urlPassword = regexp.MustCompile(`(://[^:/@]*:)[^@]*@`)
	kvPassword  = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|\S+)`)
)
