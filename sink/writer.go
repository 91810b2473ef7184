// The Writer: its Config (defaults, validation), New, and the helpers the
// other files share. What a Write does is in transaction.go.

package sink

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/dedup"
)

// Config configures a Writer. Zero values take the defaults noted.
type Config struct {
	Schema   string    // Postgres schema holding sink's tables; default "public"
	Group    string    // consumer group; the sink_offsets key. Required.
	Bus      string    // the processed_events.bus value; default "kafka"
	Handlers []Handler // at least one; names must be unique, non-empty, valid UTF-8 without NUL
	// Parse, if set, reads an event once for all handlers: it is called
	// once per event that some handler claimed in the batch's transaction
	// (not for events every handler has seen), and handlers receive its
	// result as Event.Parsed. An error refuses the event as a
	// [RejectError] would, for every handler at once: it applies nothing,
	// its claims are taken back, and it becomes a dead letter with the
	// reason "rejected: " + the error's text — without the rollback and
	// isolation a handler's rejection costs. A panic in Parse fails the
	// batch, which is retried, like a handler's panic. Parse must be safe
	// for concurrent use and give the same answer for the same event.
	Parse func(Event) (any, error)
	// Cache is the LRU fast path; nil disables it.
	Cache *dedup.Cache
	// TxTimeout bounds one transaction, COMMIT included; default 30s.
	TxTimeout time.Duration
	// IdleTimeout is how long the server keeps a batch's transaction open
	// while the writer sends nothing (idle_in_transaction_session_timeout);
	// default 5s, at most TxTimeout. A writer that stalls mid-transaction
	// (a stopped process, a zombie) holds its row locks — the counters
	// every partition updates — that long at most, so one frozen member
	// stalls the others' batches for IdleTimeout, not TxTimeout. A handler
	// that computes longer than this between two statements has its
	// transaction ended (and retried).
	IdleTimeout time.Duration
	// SkipLogLimit is how many dedup.skip lines a batch logs at Info; the
	// rest are logged at Debug. Default 10.
	SkipLogLimit int
	// SkipEventLimit is how many skipped keys a batch records as span
	// events; the total is always an attribute. Default 32.
	SkipEventLimit int
	Logger         *slog.Logger         // nil discards
	TracerProvider trace.TracerProvider // nil disables tracing
}

// Default values of Config.
const (
	DefaultSchema         = "public"
	DefaultBus            = "kafka"
	DefaultTxTimeout      = 30 * time.Second
	DefaultIdleTimeout    = 5 * time.Second
	DefaultSkipLogLimit   = 10
	DefaultSkipEventLimit = 32
)

// withDefaults returns c with every zero value replaced by its default.
func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Bus == "" {
		c.Bus = DefaultBus
	}
	if c.TxTimeout == 0 {
		c.TxTimeout = DefaultTxTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = min(DefaultIdleTimeout, c.TxTimeout)
	}
	if c.SkipLogLimit == 0 {
		c.SkipLogLimit = DefaultSkipLogLimit
	}
	if c.SkipEventLimit == 0 {
		c.SkipEventLimit = DefaultSkipEventLimit
	}
	return c
}

// Validate returns every problem with c (after defaults), each naming its
// field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var ps []error
	if c.Group == "" {
		ps = append(ps, errors.New("sink: Group is required"))
	}
	if !validIdentifier(c.Schema) {
		ps = append(ps, fmt.Errorf("sink: Schema %q is not a lower-case SQL identifier", c.Schema))
	}
	if c.TxTimeout < 0 {
		ps = append(ps, fmt.Errorf("sink: TxTimeout %v is negative", c.TxTimeout))
	}
	if c.IdleTimeout < 0 || c.IdleTimeout > c.TxTimeout {
		ps = append(ps, fmt.Errorf("sink: IdleTimeout %v is not between 0 and TxTimeout %v", c.IdleTimeout, c.TxTimeout))
	}
	if len(c.Handlers) == 0 {
		ps = append(ps, errors.New("sink: at least one handler is required"))
	}
	seen := map[string]bool{}
	for _, h := range c.Handlers {
		switch name := h.Name(); {
		case name == "":
			ps = append(ps, errors.New("sink: a handler has an empty name"))
		case !utf8.ValidString(name):
			ps = append(ps, fmt.Errorf("sink: handler %q: the name is not valid UTF-8", name))
		case strings.IndexByte(name, 0) >= 0:
			ps = append(ps, fmt.Errorf("sink: handler %q: the name contains a NUL", name))
		case seen[name]:
			ps = append(ps, fmt.Errorf("sink: handler %q registered twice", name))
		default:
			seen[name] = true
		}
	}
	return errors.Join(ps...)
}

func validIdentifier(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Writer writes partition batches to Postgres, one transaction each. It is
// safe for concurrent use by several partition workers; each call of Write
// is independent. The pool is owned by the caller.
type Writer struct {
	pool      *pgxpool.Pool
	cfg       Config
	tracer    trace.Tracer
	log       *slog.Logger
	begin     pgx.TxOptions
	processed string // sanitized, schema-qualified table names
	offsets   string
	dead      string
	filtered  bool              // some handler is a TopicFilter
	stats     *dedup.Statistics // analyzes each new dedup slice once it holds claims
	byInsert  atomic.Int32      // claims left to write by insert after a contended one (see claimKeys)
	inflight  inflight          // the events its open transactions claim
}

// New returns a Writer over pool. It does not touch the database; run
// Migrate first. Every problem with cfg is reported.
func New(pool *pgxpool.Pool, cfg Config) (*Writer, error) {
	cfg = cfg.withDefaults()
	err := cfg.Validate()
	if pool == nil {
		err = errors.Join(errors.New("sink: nil pool"), err)
	}
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	table := func(name string) string { return pgx.Identifier{cfg.Schema, name}.Sanitize() }
	// One round trip begins the transaction and bounds how long the server
	// keeps it open while the client is silent.
	begin := fmt.Sprintf("BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = %d",
		max(cfg.IdleTimeout.Milliseconds(), 1))
	filtered := slices.ContainsFunc(cfg.Handlers, func(h Handler) bool { _, ok := h.(TopicFilter); return ok })
	return &Writer{
		filtered:  filtered,
		pool:      pool,
		cfg:       cfg,
		tracer:    tp.Tracer("github.com/onceflow/onceflow/sink"),
		log:       log,
		begin:     pgx.TxOptions{BeginQuery: begin},
		processed: table("processed_events"),
		offsets:   table("sink_offsets"),
		dead:      table("dead_letters"),
		stats:     dedup.NewStatistics(cfg.Schema, log),
	}, nil
}

// Handlers returns the names of the configured handlers, in order.
func (w *Writer) Handlers() []string {
	names := make([]string, len(w.cfg.Handlers))
	for i, h := range w.cfg.Handlers {
		names[i] = h.Name()
	}
	return names
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
