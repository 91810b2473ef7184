package processor

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// OutOfRange is what a Consumer does with a partition whose offset stored
// in Postgres lies outside the partition's log.
type OutOfRange string

const (
	// ResumeAtLogStart consumes the partition from its log start: below
	// the start, the records in between were deleted by retention and
	// cannot be read by anyone; beyond the end, the topic was recreated
	// and its new records are read from the beginning (the dedup keeps
	// events already applied from applying twice).
	ResumeAtLogStart OutOfRange = "earliest"
	// PauseOnOutOfRange leaves the partition paused, its lag the whole
	// log, until an operator decides: the member restarted with
	// ResumeAtLogStart goes on from the log start.
	PauseOnOutOfRange OutOfRange = "pause"
)

// Config configures a Consumer. Zero values take the defaults (Default…).
type Config struct {
	Brokers  []string // required
	Topics   []string // required
	Group    string   // required
	ClientID string   // default "onceflow"

	BatchMaxRecords int           // close a batch at this many records; default 1000, at most 100000
	BatchMaxBytes   int           // or at this many value bytes; default 4 MiB
	BatchLinger     time.Duration // or this long after its first record; default 50ms

	// FetchMaxBytes bounds one fetch response from one broker (Kafka's
	// fetch.max.bytes); FetchMaxPartitionBytes bounds one partition's share
	// of it (max.partition.fetch.bytes). A broker still returns a first
	// record batch larger than either, so that the partition progresses.
	// Defaults 16 MiB and 256 KiB. Together with the per-partition queue
	// (paused at twice BatchMaxBytes or twice BatchMaxRecords) they bound
	// what a Consumer holds of the stream; see "Memory" in the package doc.
	FetchMaxBytes          int
	FetchMaxPartitionBytes int

	Decode DecodeConfig // value format, event id source, record size limit

	// DeadLetterTopic receives a copy of every dead letter, with headers
	// reason, topic, partition, offset and event_id, published
	// asynchronously from the dead_letters table (the truth), at least
	// once. A value the topic refuses is published without it, with a
	// header value_omitted saying why; a copy the broker refuses is tried
	// again after RetryBackoff, doubling up to MaxRetryBackoff. Empty: the
	// table only.
	DeadLetterTopic string

	// CommitInterval is how often marked Kafka offsets are committed in the
	// background; they are also committed on revoke and on shutdown.
	// Default 1s. Postgres holds the true offset, so a lagging Kafka commit
	// costs no replay.
	CommitInterval time.Duration
	// GroupProtocol is the consumer-group protocol: ClassicProtocol (the
	// default) or ConsumerProtocol (KIP-848, Kafka 4.0+); see protocol.go.
	// Members of one group should use the same.
	GroupProtocol GroupProtocol
	// InstanceID, if set, makes the member static (KIP-345): it keeps its
	// place in the group across a restart. A member that stops (Kill,
	// Abort, or Run's drain: a static member does not leave the group) and
	// comes back with the same InstanceID within the session timeout gets
	// its partitions back with no rebalance; until then they have no
	// owner, and no other member is assigned them. Each member of a
	// group needs its own. Two running members with one InstanceID: under
	// ClassicProtocol the one that joined last takes the partitions and
	// the other stops (Run returns ErrInstanceFenced); under
	// ConsumerProtocol the broker refuses the one that joined last, which
	// logs an error and consumes nothing until the other leaves or its
	// session times out. At most 249 of [a-zA-Z0-9._-].
	InstanceID string
	// SessionTimeout and RebalanceTimeout are the group's; defaults 10s
	// and 30s. Under ConsumerProtocol the session timeout is the broker's
	// (group.consumer.session.timeout.ms) and SessionTimeout is not used.
	SessionTimeout   time.Duration
	RebalanceTimeout time.Duration
	// HeartbeatInterval is how often a ClassicProtocol member heartbeats
	// to keep its session. Zero (the default) derives it from the
	// session: a third of SessionTimeout, at most 3s (DefaultHeartbeatInterval),
	// as Kafka's consumer advises. A member whose heartbeat does not come
	// well within the session loses its partitions at every session, for
	// ever; a value set must be at most a third of SessionTimeout. Under
	// ConsumerProtocol the broker sets the interval
	// (group.consumer.heartbeat.interval.ms) and HeartbeatInterval only
	// paces the heartbeats retried after a failed one.
	HeartbeatInterval time.Duration
	// DrainTimeout bounds finishing in-flight batches on revoke or
	// shutdown; what is not committed by then is aborted (rolled back),
	// but for a COMMIT already sent, whose answer is waited for (see
	// Consumer.Abort).
	// Default 10s; it must be shorter than RebalanceTimeout.
	DrainTimeout time.Duration
	// RetryBackoff is the first wait after a failed transaction, doubling
	// up to MaxRetryBackoff; defaults 100ms and 5s. A partition retrying
	// is paused; the others go on.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// CallTimeout bounds every call to Postgres outside batch transactions
	// (taking partitions, dead-letter bookkeeping) and every Kafka admin
	// call; default 10s.
	CallTimeout time.Duration
	// ProduceTimeout bounds publishing dead letters to DeadLetterTopic;
	// default 30s.
	ProduceTimeout time.Duration
	// OffsetOutOfRange says what happens to a partition whose stored offset
	// is outside its log; default ResumeAtLogStart. Either way an error
	// naming the topic, the partition and both offsets is logged and
	// counted (Stats.OffsetsOutOfRange).
	OffsetOutOfRange OutOfRange
	// DedupHorizon is how long the sink keeps its dedup state
	// (dedup.Retention; 0: forever). When set, the consumer reads the
	// consumed topics' retention.ms once the brokers answer and warns for
	// each that keeps records longer: a rewind or a redelivery older than
	// the horizon would apply its events again.
	DedupHorizon time.Duration

	Logger         *slog.Logger                  // nil discards
	TracerProvider trace.TracerProvider          // nil disables tracing
	Propagator     propagation.TextMapPropagator // reads producer span contexts; default W3C trace context

	// OnBatch, if set, is called after each batch commits (or is found
	// whole with its offset deferred: BatchInfo.Result.OffsetDeferred),
	// from that partition's worker goroutine (so concurrently across
	// partitions).
	OnBatch func(BatchInfo)

	// KafkaOptions are appended to the client's options (TLS, SASL, test
	// tuning). Options that conflict with the consumer's own behaviour,
	// such as auto-commit settings, must not be passed.
	KafkaOptions []kgo.Opt
}

// Defaults of Config.
const (
	DefaultClientID         = "onceflow"
	DefaultBatchMaxRecords  = 1000
	DefaultBatchMaxBytes    = 4 << 20
	DefaultBatchLinger      = 50 * time.Millisecond
	DefaultCommitInterval   = time.Second
	DefaultSessionTimeout   = 10 * time.Second
	DefaultRebalanceTimeout = 30 * time.Second
	DefaultDrainTimeout     = 10 * time.Second
	DefaultRetryBackoff     = 100 * time.Millisecond
	DefaultMaxRetryBackoff  = 5 * time.Second
	DefaultCallTimeout      = 10 * time.Second
	DefaultProduceTimeout   = 30 * time.Second
	DefaultOffsetOutOfRange = ResumeAtLogStart
	// MaxBatchRecords is the largest BatchMaxRecords accepted.
	MaxBatchRecords = 100000
)

// Fetch sizes of Config (see "Memory" in the package doc).
const (
	// DefaultFetchMaxBytes is a third of franz-go's 50 MiB: one response
	// per broker is in flight or buffered at a time, and its records'
	// values are not copied out of it, so this is the unit in which a
	// member's fetch memory grows.
	DefaultFetchMaxBytes = 16 << 20
	// DefaultFetchMaxPartitionBytes is a quarter of Kafka's 1 MiB: a poll
	// queues each partition's whole share, on top of what the queue holds
	// when it is paused, so a queue grows past its high water by a share
	// decompressed (or by a larger first record batch, which Kafka returns
	// whole). At 1 MiB a 12-partition member draining a backlog peaked at
	// 339 MiB instead of 150, for the same rate (benchmarks/PROFILE.md).
	DefaultFetchMaxPartitionBytes = 256 << 10
	// MaxFetchBytes is the largest FetchMaxBytes accepted: franz-go's
	// default BrokerMaxReadBytes, which a response may not exceed.
	MaxFetchBytes = 100 << 20
)

// withDefaults returns c with every zero value replaced by its default.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.BatchMaxRecords == 0 {
		c.BatchMaxRecords = DefaultBatchMaxRecords
	}
	if c.BatchMaxBytes == 0 {
		c.BatchMaxBytes = DefaultBatchMaxBytes
	}
	if c.FetchMaxBytes == 0 {
		c.FetchMaxBytes = DefaultFetchMaxBytes
	}
	if c.FetchMaxPartitionBytes == 0 {
		c.FetchMaxPartitionBytes = DefaultFetchMaxPartitionBytes
	}
	def(&c.BatchLinger, DefaultBatchLinger)
	def(&c.CommitInterval, DefaultCommitInterval)
	def(&c.SessionTimeout, DefaultSessionTimeout)
	def(&c.RebalanceTimeout, DefaultRebalanceTimeout)
	def(&c.HeartbeatInterval, heartbeatFor(c.SessionTimeout))
	def(&c.DrainTimeout, DefaultDrainTimeout)
	def(&c.RetryBackoff, DefaultRetryBackoff)
	def(&c.MaxRetryBackoff, DefaultMaxRetryBackoff)
	def(&c.CallTimeout, DefaultCallTimeout)
	def(&c.ProduceTimeout, DefaultProduceTimeout)
	if c.OffsetOutOfRange == "" {
		c.OffsetOutOfRange = DefaultOffsetOutOfRange
	}
	if c.GroupProtocol == "" {
		c.GroupProtocol = DefaultGroupProtocol
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	return c
}

// Validate returns every problem with c (after defaults), each naming its
// field. New calls it; config.Validate reports the same problems by key.
func (c Config) Validate() error {
	c = c.withDefaults()
	var ps []error
	bad := func(format string, args ...any) { ps = append(ps, fmt.Errorf("processor: "+format, args...)) }
	if len(c.Brokers) == 0 {
		bad("no Brokers")
	}
	if len(c.Topics) == 0 {
		bad("no Topics")
	}
	if c.Group == "" {
		bad("no consumer Group")
	}
	if c.BatchMaxRecords < 1 || c.BatchMaxRecords > MaxBatchRecords {
		bad("BatchMaxRecords %d is not 1..%d", c.BatchMaxRecords, MaxBatchRecords)
	}
	if c.BatchMaxBytes < 1024 {
		bad("BatchMaxBytes %d is below 1024", c.BatchMaxBytes)
	}
	if c.FetchMaxBytes < 1024 || c.FetchMaxBytes > MaxFetchBytes {
		bad("FetchMaxBytes %d is not 1024..%d", c.FetchMaxBytes, MaxFetchBytes)
	}
	if c.FetchMaxPartitionBytes < 1024 || c.FetchMaxPartitionBytes > c.FetchMaxBytes {
		bad("FetchMaxPartitionBytes %d is not 1024..FetchMaxBytes (%d)", c.FetchMaxPartitionBytes, c.FetchMaxBytes)
	}
	positive := map[string]time.Duration{
		"BatchLinger": c.BatchLinger, "CommitInterval": c.CommitInterval, "SessionTimeout": c.SessionTimeout,
		"HeartbeatInterval": c.HeartbeatInterval, "RebalanceTimeout": c.RebalanceTimeout, "DrainTimeout": c.DrainTimeout, "RetryBackoff": c.RetryBackoff,
		"MaxRetryBackoff": c.MaxRetryBackoff, "CallTimeout": c.CallTimeout, "ProduceTimeout": c.ProduceTimeout,
	}
	for _, name := range []string{"BatchLinger", "CommitInterval", "SessionTimeout", "HeartbeatInterval", "RebalanceTimeout", "DrainTimeout",
		"RetryBackoff", "MaxRetryBackoff", "CallTimeout", "ProduceTimeout"} {
		if positive[name] < 0 {
			bad("%s %v is negative", name, positive[name])
		}
	}
	if c.BatchLinger > time.Minute {
		bad("BatchLinger %v is over 1m", c.BatchLinger)
	}
	if c.HeartbeatInterval > 0 && c.SessionTimeout > 0 && c.HeartbeatInterval > c.SessionTimeout/3 {
		bad("HeartbeatInterval %v is above a third of SessionTimeout %v (%v): the member would lose its session between heartbeats",
			c.HeartbeatInterval, c.SessionTimeout, c.SessionTimeout/3)
	}
	if c.DrainTimeout >= c.RebalanceTimeout {
		bad("DrainTimeout %v must be shorter than RebalanceTimeout %v (a revoke must finish within the rebalance)", c.DrainTimeout, c.RebalanceTimeout)
	}
	if c.MaxRetryBackoff < c.RetryBackoff {
		bad("MaxRetryBackoff %v is shorter than RetryBackoff %v", c.MaxRetryBackoff, c.RetryBackoff)
	}
	for _, t := range c.Topics {
		if t == c.DeadLetterTopic {
			bad("DeadLetterTopic %q is also a consumed topic", t)
		}
	}
	if c.OffsetOutOfRange != ResumeAtLogStart && c.OffsetOutOfRange != PauseOnOutOfRange {
		bad("OffsetOutOfRange %q is not %q or %q", c.OffsetOutOfRange, ResumeAtLogStart, PauseOnOutOfRange)
	}
	if c.GroupProtocol != ClassicProtocol && c.GroupProtocol != ConsumerProtocol {
		bad("GroupProtocol %q is not %q or %q", c.GroupProtocol, ClassicProtocol, ConsumerProtocol)
	}
	if err := CheckInstanceID(c.InstanceID); err != nil {
		bad("InstanceID %v", err)
	}
	if err := c.Decode.Validate(); err != nil {
		ps = append(ps, err)
	}
	return errors.Join(ps...)
}

// DefaultHeartbeatInterval is the longest heartbeat interval a zero
// Config.HeartbeatInterval derives (franz-go's and Kafka's default);
// shorter sessions get a third of theirs.
const DefaultHeartbeatInterval = 3 * time.Second

// heartbeatFor is the heartbeat interval a session of d gets when
// Config.HeartbeatInterval is zero: a third of it, at most
// DefaultHeartbeatInterval.
func heartbeatFor(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultHeartbeatInterval
	}
	return min(DefaultHeartbeatInterval, d/3)
}
