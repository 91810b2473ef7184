package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
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

// Lease is what a new owner of a partition gets from [Writer.Take].
type Lease struct {
	// Epoch is the owner's fencing token: every batch it writes carries
	// it, and a batch of any older epoch is fenced.
	Epoch int64
	// NextOffset is the offset stored for the partition, where
	// consumption must start; -1 when none is stored yet.
	NextOffset int64
	// TopicID is the Kafka topic id NextOffset was stored for (Batch.TopicID
	// of the last batch); not Valid when unknown. A different id now means
	// the topic was deleted and recreated: NextOffset is not an offset of
	// the log there is today.
	TopicID uuid.NullUUID
}

// Take makes the caller the writer of the given partitions of topic: in one
// statement it bumps each partition's epoch in sink_offsets (creating the
// row if needed) and returns the new epoch with the stored offset. From
// then on, batches of any earlier epoch are fenced, whether or not the new
// owner has written anything. Rows are taken in partition order, so
// concurrent takers do not deadlock.
func (w *Writer) Take(ctx context.Context, topic string, partitions []int32) (map[int32]Lease, error) {
	ps := slices.Clone(partitions)
	slices.Sort(ps)
	rows, err := w.pool.Query(ctx, `INSERT INTO `+w.offsets+` AS o (consumer_group, topic, partition, next_offset, epoch)
SELECT $1, $2, p, NULL, 1 FROM unnest($3::int[]) AS p ORDER BY p
ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET epoch = o.epoch + 1, updated_at = now()
RETURNING partition, epoch, coalesce(next_offset, -1), topic_id`, w.cfg.Group, topic, ps)
	if err != nil {
		return nil, fmt.Errorf("take partitions: %w", err)
	}
	out := make(map[int32]Lease, len(ps))
	var p int32
	var l Lease
	_, err = pgx.ForEachRow(rows, []any{&p, &l.Epoch, &l.NextOffset, &l.TopicID}, func() error { out[p] = l; return nil })
	if err != nil {
		return nil, fmt.Errorf("take partitions: %w", err)
	}
	return out, nil
}

// pending is one (event, handler) pair that survived the cache.
type pending struct {
	key    dedup.Key
	event  int          // index into Batch.Events
	digest dedup.Digest // of the event's payload
}

// outcome is what one application of some events did inside a transaction.
type outcome struct {
	claimed []dedup.Key
	digests []dedup.Digest // digests[i] was stored with claimed[i]
	already []skip
	dead    []DeadLetter // events isolated into dead letters, conflicts included
	slice   int32        // the dedup slice the claims went to, when there are any
	next    int64        // the offset the transaction stored (see Result.NextOffset)
	// recorded are the dead_letters rows the transaction inserted (set by
	// transaction, not by merge): the dead letters of the records it
	// settled that were not recorded before.
	recorded []DeadLetter
}

func (o *outcome) merge(p outcome) {
	o.claimed = append(o.claimed, p.claimed...)
	o.digests = append(o.digests, p.digests...)
	o.already = append(o.already, p.already...)
	o.dead = append(o.dead, p.dead...)
	o.slice = max(o.slice, p.slice)
}

// Write applies b in one transaction and returns what it did. On success the
// effects of every event of b that applied, the dead letters (b's own and
// the events isolated below), and sink_offsets = b.NextOffset are
// committed, and the claimed keys are in the cache — unless b asked to
// defer its offset ([Batch.DeferOffset]) and was found whole: then nothing
// is written, no transaction begun, and [Result.OffsetDeferred] is set.
//
// When a handler fails with a data error ([Classify] says [Data]: a
// [RejectError], a data exception, a constraint violation, a value too
// large for an index), the transaction is rolled back and the batch is
// written again in one transaction that isolates the culprits: events are
// applied in halves under savepoints, recursively (one by one once most
// events settled were culprits), and each event that fails on its own
// becomes a dead letter with the SQLSTATE and message as its reason; all
// the others apply. k bad events among n cost O(k·log n) savepoints
// (at most n plus a few when nearly all are bad) and two transactions.
// Each savepoint costs a few round trips (the claim, the handlers, the
// savepoint itself), so isolating many culprits over a slow link can take
// longer than TxTimeout: with [Batch.AllowPrefix], the isolating
// transaction then commits the prefix of b it has settled, and
// [Result.NextOffset] says where the rest begins. A timeout is never
// taken for a culprit: nothing is dead-lettered because the database was
// slow. A dead-lettered event applies nothing
// for any handler, and leaves no claim. The isolating transaction locks
// all of the batch's keys at once before its first savepoint, in the byte
// order every claim writes in, so it deadlocks with no other batch's
// claims, isolating or not; a concurrent batch that shares keys with it
// waits for its COMMIT.
//
// ctx canceled before COMMIT is sent rolls the transaction back, and Write
// returns its error; canceled after, it does not cut COMMIT short: Write
// waits for COMMIT's answer, within the transaction's deadline (TxTimeout),
// and returns the Result of a batch that committed, as if ctx had not
// been canceled.
//
// Errors: a *FencedError (errors.Is ErrFenced) when the compare-and-set on
// (epoch, offset) fails; otherwise the transaction's error, wrapped; use
// [Classify] to decide what to do. On any error nothing is committed —
// unless COMMIT itself failed with an unknown outcome (the connection
// lost, TxTimeout reached): a retry of the same batch is then fenced with
// [FencedError.Committed] true if it had in fact committed. The cache is
// only updated after a successful COMMIT. Write does not modify b.
func (w *Writer) Write(ctx context.Context, b *Batch) (Result, error) {
	var res Result
	if b.Epoch < 1 {
		return res, fmt.Errorf("batch of %s/%d has no epoch: Take the partition first", b.Topic, b.Partition)
	}
	todo, skipped, conflicts := w.fromCache(b)
	res.SkippedLRU = len(skipped)
	if b.DeferOffset && len(conflicts) == 0 {
		found, err := w.foundWhole(ctx, b, todo)
		if err != nil {
			return res, err
		}
		if found != nil {
			res.SkippedPostgres, res.OffsetDeferred, res.NextOffset = len(found), true, b.NextOffset
			w.logSkips(ctx, b, append(skipped, found...))
			return res, nil
		}
	}

	res.Attempts++
	isolating := b.Isolate && len(todo) > 0
	out, err := w.transaction(ctx, b, todo, conflicts, isolating)
	if err != nil && !isolating && isolatable(err) {
		w.log.Warn("batch failed on a data error; isolating the events that cause it",
			"topic", b.Topic, "partition", b.Partition, "offset", firstOffset(b), "batch_size", len(b.Events), "err", err)
		res.Attempts++
		out, err = w.transaction(ctx, b, todo, conflicts, true)
	}
	if err != nil {
		return res, err
	}
	res.NextOffset = out.next
	if out.next < b.NextOffset {
		// A prefix committed: what lies beyond is the next batch's.
		skipped = slices.DeleteFunc(skipped, func(s skip) bool { return b.Events[s.event].Offset >= out.next })
		res.SkippedLRU = len(skipped)
		conflicts = below(conflicts, out.next)
		w.log.Info("isolation ran long: committed the records isolated so far; the rest follow in the next batch",
			"topic", b.Topic, "partition", b.Partition, "offset", firstOffset(b), "next_offset", out.next,
			"batch_size", len(b.Events), "dead_letters", len(out.dead))
	}
	// Committed: the keys claimed are known committed, with their digests.
	// The keys found claimed are too, but the cache is not told: in a
	// replay's re-read every key is found once, by a member whose cache
	// started empty, and remembering each would cost an insertion and
	// evict the member's own recent claims, which redeliveries hit.
	w.cfg.Cache.Remember(out.claimed, out.digests)
	w.analyzeSlice(ctx, out)
	skipped = append(skipped, out.already...)
	res.Applied = len(out.claimed)
	res.SkippedPostgres = len(out.already)
	res.Rejected = append(slices.Clip(conflicts), out.dead...)
	res.DeadLetters = len(out.recorded)
	for _, d := range out.recorded {
		if d.Reason == ReasonConflict {
			res.Conflicts++
		}
	}
	w.logSkips(ctx, b, skipped)
	w.logDeadLetters(out.recorded)
	return res, nil
}

// logDeadLetters logs each dead letter a committed batch recorded: a
// record read again whose dead letter was recorded before is not logged
// again (nor counted, see Result.DeadLetters).
func (w *Writer) logDeadLetters(recorded []DeadLetter) {
	for _, d := range recorded {
		id := ""
		if d.EventID.Valid {
			id = d.EventID.UUID.String()
		}
		w.log.Warn("dead letter recorded", "topic", d.Topic, "partition", d.Partition, "offset", d.Offset,
			"event_id", id, "reason", d.Reason)
	}
}

// foundWhole reports whether b has nothing to write, looking in
// Postgres outside any transaction: its dead letters (records it could not
// decode) are in dead_letters at their offsets already, and every key is
// claimed with its event's payload digest. It returns the keys as skips
// then (none when there are none), else nil: a dead letter not recorded,
// a key not claimed, or a claim that stored another digest (a conflict,
// which the transaction refuses). A claim or a dead letter found is
// committed and stays so (only retention drops claims, after the
// horizon), so no transaction is needed to trust it.
func (w *Writer) foundWhole(ctx context.Context, b *Batch, keys []pending) ([]skip, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout) // bounded as a transaction is
	defer cancel()
	if len(b.DeadLetters) > 0 {
		if ok, err := w.deadLettersRecorded(ctx, b); err != nil || !ok {
			return nil, err
		}
	}
	if len(keys) == 0 {
		return []skip{}, nil
	}
	ctx, span := w.tracer.Start(ctx, "dedup.lookup", trace.WithAttributes(attribute.Int("onceflow.keys", len(keys))))
	found, stored, err := dedup.Lookup(ctx, w.pool, w.processed, keysAt(keys, nil))
	if err != nil {
		endSpan(span, err)
		return nil, err
	}
	out := make([]skip, 0, len(keys))
	for i, p := range keys {
		if !found[i] || stored[i].Conflicts(p.digest) {
			break
		}
		out = append(out, skip{p.key, p.event, "postgres", stored[i]})
	}
	span.SetAttributes(attribute.Bool("onceflow.found_whole", len(out) == len(keys)))
	span.End()
	if len(out) < len(keys) {
		return nil, nil
	}
	return out, nil
}

// deadLettersRecorded reports whether every dead letter of b is in
// dead_letters already, at its offset and under b's topic id (a row of
// another id, or of none, is another record: see insertDeadLetters):
// writing it again would change nothing.
func (w *Writer) deadLettersRecorded(ctx context.Context, b *Batch) (bool, error) {
	offsets := make([]int64, len(b.DeadLetters))
	for i, d := range b.DeadLetters {
		if d.Topic != b.Topic || d.Partition != b.Partition {
			return false, nil
		}
		offsets[i] = d.Offset
	}
	var n int
	err := w.pool.QueryRow(ctx, `SELECT count(*) FROM `+w.dead+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND "offset" = ANY($4::bigint[])
  AND topic_id IS NOT DISTINCT FROM $5::uuid`,
		w.cfg.Group, b.Topic, b.Partition, offsets, b.TopicID).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("look up dead letters: %w", err)
	}
	return n == len(slices.Compact(slices.Sorted(slices.Values(offsets)))), nil
}

// analyzeTimeout bounds one look at a dedup slice's statistics, the
// ANALYZE included.
const analyzeTimeout = 10 * time.Second

// analyzeSlice sees to the planner statistics of the dedup slice out's
// claims went to (see dedup.Statistics): until the slice has some, the
// first look-ups on each new connection scan all of it. It looks at most
// once a second, and only until the slice is analyzed (or given up), after
// a batch that claimed keys; it runs on the worker that wrote the batch,
// before the batch's offset is marked, and analyzes once per slice in a
// member's life (about 0.1 s for the 90 000 rows it waits for). A failure
// is logged; the batch is committed either way.
func (w *Writer) analyzeSlice(ctx context.Context, out outcome) {
	if len(out.claimed) == 0 || w.stats.Done(out.slice) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, analyzeTimeout)
	defer cancel()
	if err := w.stats.Ensure(ctx, w.pool, out.slice); err != nil && !errors.Is(ctx.Err(), context.Canceled) {
		w.log.Warn("could not see to the planner statistics of the dedup slice", "err", err)
	}
}

// below returns the dead letters of dls at offsets below next, in a new
// slice.
func below(dls []DeadLetter, next int64) []DeadLetter {
	var out []DeadLetter
	for _, d := range dls {
		if d.Offset < next {
			out = append(out, d)
		}
	}
	return out
}

func firstOffset(b *Batch) int64 {
	if len(b.Events) > 0 {
		return b.Events[0].Offset
	}
	return b.NextOffset
}

// fromCache returns the (event, handler) keys of b for the handlers that
// consume b's topic, dropping those the cache knows are committed. An
// event the cache knows under another payload digest is a conflict: none
// of its keys is kept, and it is returned as a dead letter.
func (w *Writer) fromCache(b *Batch) ([]pending, []skip, []DeadLetter) {
	hs := w.cfg.Handlers
	if w.filtered {
		hs = nil
		for _, h := range w.cfg.Handlers {
			if f, ok := h.(TopicFilter); !ok || f.Consumes(b.Topic) {
				hs = append(hs, h)
			}
		}
	}
	todo := make([]pending, 0, len(b.Events)*len(hs))
	var skipped []skip
	var conflicts []DeadLetter
	for i := range b.Events {
		d := dedup.PayloadDigest(b.Events[i].Value)
		mark := len(todo)
		marks := len(skipped)
		conflict := false
		for _, h := range hs {
			k := dedup.Key{EventID: b.Events[i].ID, Handler: h.Name()}
			if seen, c := w.cfg.Cache.Seen(k, d); seen {
				conflict = conflict || c
				skipped = append(skipped, skip{k, i, "lru", d})
				continue
			}
			todo = append(todo, pending{k, i, d})
		}
		if conflict {
			todo, skipped = todo[:mark], skipped[:marks]
			conflicts = append(conflicts, w.conflictLetter(b, i, "lru"))
		}
	}
	return todo, skipped, conflicts
}

type skip struct {
	key    dedup.Key
	event  int
	layer  string       // lru | postgres
	digest dedup.Digest // the digest stored with the key
}

// isolatable reports whether err is a data error raised by the events'
// application (a handler, or a deferred constraint at COMMIT), which the
// isolating transaction can attribute to events.
func isolatable(err error) bool {
	if !IsData(err) {
		return false
	}
	var he *handlerError
	var ce *commitError
	return errors.As(err, &he) || errors.As(err, &ce)
}

// commitError is a failed COMMIT.
type commitError struct{ err error }

func (e *commitError) Error() string { return "commit: " + e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

// transaction runs one transaction: apply (or isolate), dead letters (b's,
// the cache's conflicts, and the events refused in it), offset
// compare-and-set, commit.
func (w *Writer) transaction(ctx context.Context, b *Batch, todo []pending, conflicts []DeadLetter, isolate bool) (outcome, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	tx, err := w.pool.BeginTx(ctx, w.begin)
	if err != nil {
		return outcome{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	var out outcome
	if isolate {
		var stopAt time.Time
		if b.AllowPrefix {
			stopAt = start.Add(w.cfg.TxTimeout / 2)
		}
		var next int64
		out, next, err = w.isolate(ctx, tx, b, todo, stopAt)
		out.next = next
	} else {
		out, err = w.apply(ctx, tx, b, todo, nil)
		out.next = b.NextOffset
	}
	if err != nil {
		return outcome{}, err
	}
	dead := append(append(slices.Clip(b.DeadLetters), conflicts...), out.dead...)
	if out.next < b.NextOffset {
		dead = below(dead, out.next)
	}
	if out.recorded, err = w.insertDeadLetters(ctx, tx, b.TopicID, dead); err != nil {
		return outcome{}, err
	}
	octx, span := w.tracer.Start(ctx, "sink.offset_cas", trace.WithAttributes(
		attribute.Int64("onceflow.epoch", b.Epoch), attribute.Int64("onceflow.fence", b.Fence),
		attribute.Int64("onceflow.next_offset", out.next)))
	err = w.storeOffset(octx, tx, b, out.next)
	endSpan(span, err)
	if err != nil {
		return outcome{}, err
	}
	// ctx canceled rolls the transaction back up to here, and no further:
	// a COMMIT sent is waited for to its answer, within the transaction's
	// deadline. Cancelling it could not take it back (the server commits
	// what it has received) but only lose its answer, and with it a
	// committed batch's result: an aborted member would count nothing of a
	// batch it committed (processor.Consumer.Abort), and no one else would.
	if err := ctx.Err(); err != nil {
		return outcome{}, &commitError{err}
	}
	deadline, _ := ctx.Deadline()
	cctx, cancelCommit := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancelCommit()
	cctx, span = w.tracer.Start(cctx, "sink.commit")
	err = tx.Commit(cctx)
	endSpan(span, err)
	if err != nil {
		return outcome{}, &commitError{err}
	}
	return out, nil
}

// apply claims keys and runs each handler on the events it claimed.
//
// h is nil but in an isolating transaction (see claim).
func (w *Writer) apply(ctx context.Context, tx pgx.Tx, b *Batch, keys []pending, h *held) (outcome, error) {
	traceID := ""
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		traceID = sc.TraceID().String()
	}
	won, stored, slice, err := w.claim(ctx, tx, keys, traceID, h)
	if err != nil {
		return outcome{}, err
	}
	conflicting := conflicts(keys, won, stored)
	parsed, rejected, err := w.parse(b, keys, won, conflicting)
	if err != nil {
		return outcome{}, err
	}
	again, reclaimed := reclaim(keys, won, stored, conflicting, rejected)
	// Each handler's events, in one allocation per handler.
	counts := make(map[string]int, len(w.cfg.Handlers))
	nwon := 0
	for i, p := range keys {
		if won[i] {
			counts[p.key.Handler]++
			nwon++
		}
	}
	// Sized by what the claim found: a replay's re-read claims nothing.
	out := outcome{claimed: make([]dedup.Key, 0, nwon), digests: make([]dedup.Digest, 0, nwon),
		already: make([]skip, 0, len(keys)-nwon), slice: slice}
	perHandler := make(map[string][]Event, len(counts))
	for h, n := range counts {
		perHandler[h] = getEvents(n)
	}
	defer func() {
		for _, evs := range perHandler {
			putEvents(evs)
		}
	}()
	for i, p := range keys {
		switch {
		case conflicting[p.event] || rejected[p.event] != nil:
			// Refused below, with any claim it made here taken back.
		case reclaimed[p.event]:
			// Claimed again below.
		case won[i]:
			out.claimed = append(out.claimed, p.key)
			out.digests = append(out.digests, p.digest)
			e := b.Events[p.event]
			if parsed != nil {
				e.Parsed = parsed[p.event]
			}
			perHandler[p.key.Handler] = append(perHandler[p.key.Handler], e)
		default:
			out.already = append(out.already, skip{p.key, p.event, "postgres", stored[i]})
		}
	}
	if len(conflicting) > 0 || len(rejected) > 0 {
		dead, err := w.refuse(ctx, tx, b, keys, won, conflicting, rejected)
		if err != nil {
			return outcome{}, err
		}
		out.dead = append(out.dead, dead...)
	}
	for _, h := range w.cfg.Handlers {
		events := perHandler[h.Name()]
		if len(events) == 0 {
			continue
		}
		hctx, span := w.tracer.Start(ctx, "handler "+h.Name(), trace.WithAttributes(
			attribute.String("onceflow.handler", h.Name()), attribute.Int("onceflow.events", len(events))))
		err := runHandler(hctx, h, tx, events)
		endSpan(span, err)
		if err != nil {
			return outcome{}, &handlerError{handler: h.Name(), err: err}
		}
	}
	if len(again) > 0 {
		o, err := w.apply(ctx, tx, b, again, h)
		if err != nil {
			return outcome{}, err
		}
		out.merge(o)
	}
	return out, nil
}

// eventSlices recycles the slices of events apply hands the handlers,
// which keep none of them past Apply (Handler's contract).
var eventSlices sync.Pool

// getEvents returns an empty slice of events with room for n.
func getEvents(n int) []Event {
	if p, ok := eventSlices.Get().(*[]Event); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]Event, 0, n)
}

// putEvents clears evs, so that it holds on to no record, and recycles it.
func putEvents(evs []Event) {
	clear(evs)
	eventSlices.Put(&evs)
}

// reclaim finds the events that conflict only with claims that events
// Parse refused made in this transaction (a refused version then its
// correction, in one batch): those claims are taken back, so these events
// are no conflicting duplicates and claim again. It removes them from
// conflicting and returns their keys, and the events.
func reclaim(keys []pending, won []bool, stored []dedup.Digest, conflicting map[int]bool, rejected map[int]error) ([]pending, map[int]bool) {
	if len(conflicting) == 0 || len(rejected) == 0 {
		return nil, nil
	}
	refused := map[dedup.Key]bool{}
	for i, p := range keys {
		if won[i] && rejected[p.event] != nil {
			refused[p.key] = true
		}
	}
	only := map[int]bool{}
	for e := range conflicting {
		only[e] = true
	}
	for i, p := range keys {
		if won[i] || (stored[i].Conflicts(p.digest) && !refused[p.key]) {
			delete(only, p.event) // it claimed, or conflicts with a claim that stands
		}
	}
	var again []pending
	for _, p := range keys {
		if only[p.event] {
			again = append(again, p)
		}
	}
	for e := range only {
		delete(conflicting, e)
	}
	return again, only
}

// parse runs Config.Parse once on every event of b that won a claim in
// keys and is not conflicting. It returns the results by event index (nil
// without Parse) and the events Parse refused, with its errors. A panic
// in Parse is an error of the batch, as a handler's is: retried, not
// dead-lettered, since it may say more about Parse than about the event.
func (w *Writer) parse(b *Batch, keys []pending, won []bool, conflicting map[int]bool) (parsed []any, rejected map[int]error, err error) {
	if w.cfg.Parse == nil {
		return nil, nil, nil
	}
	defer func() {
		if p := recover(); p != nil {
			parsed, rejected, err = nil, nil, fmt.Errorf("parse: panic: %v\n%s", p, debug.Stack())
		}
	}()
	parsed = make([]any, len(b.Events))
	done := make([]bool, len(b.Events))
	for i, p := range keys {
		if !won[i] || done[p.event] || conflicting[p.event] {
			continue
		}
		done[p.event] = true
		v, err := w.cfg.Parse(b.Events[p.event])
		if err != nil {
			if rejected == nil {
				rejected = map[int]error{}
			}
			rejected[p.event] = err
			continue
		}
		parsed[p.event] = v
	}
	// A later copy of a refused event in b (same id and payload: another
	// payload conflicts) lost its keys to the refused copy's claims, which
	// are taken back: it is refused too, not a duplicate of a claim.
	if len(rejected) > 0 {
		refused := map[dedup.Key]error{}
		for i, p := range keys {
			if won[i] && rejected[p.event] != nil {
				refused[p.key] = rejected[p.event]
			}
		}
		for i, p := range keys {
			if perr, ok := refused[p.key]; ok && !won[i] && !conflicting[p.event] && rejected[p.event] == nil {
				rejected[p.event] = perr
			}
		}
	}
	return parsed, rejected, nil
}

// runHandler calls h.Apply, turning a panic into an error.
func runHandler(ctx context.Context, h Handler, tx pgx.Tx, events []Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return h.Apply(ctx, tx, events)
}

// deadLetter is the dead letter of event i, which failed with err; it is
// logged.
func (w *Writer) deadLetter(b *Batch, i int, err error) DeadLetter {
	dl := newDeadLetter(b, i, err)
	w.logDeadLetter(dl)
	return dl
}

// newDeadLetter is the dead letter of event i of b, which failed with err.
func newDeadLetter(b *Batch, i int, err error) DeadLetter {
	e := b.Events[i]
	return sanitizeDeadLetter(DeadLetter{
		Topic: e.Topic, Partition: e.Partition, Offset: e.Offset,
		EventID: uuid.NullUUID{UUID: e.ID, Valid: true},
		Reason:  reason(err), Key: e.Key, Value: e.Value,
	})
}

// logDeadLetter logs, at debug, an event found to be a culprit: it is a
// dead letter only if its transaction commits, and it is logged at warn
// once its row is recorded (logDeadLetters, after COMMIT).
func (w *Writer) logDeadLetter(dl DeadLetter) {
	w.log.Debug("the event cannot be applied: a dead letter if the batch commits", "topic", dl.Topic, "partition", dl.Partition,
		"offset", dl.Offset, "event_id", dl.EventID.UUID.String(), "reason", dl.Reason)
}

// storeOffset is the fence: it moves sink_offsets from (b.Epoch, b.Fence)
// to next (b.NextOffset, or the end of the prefix committed). Zero rows
// updated means another writer took the partition, or an earlier attempt
// of b committed.
func (w *Writer) storeOffset(ctx context.Context, tx pgx.Tx, b *Batch, next int64) error {
	var fence *int64
	if b.Fence >= 0 {
		fence = &b.Fence
	}
	tag, err := tx.Exec(ctx, `UPDATE `+w.offsets+` SET next_offset = $4, topic_id = coalesce($7::uuid, topic_id), updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND epoch = $5 AND next_offset IS NOT DISTINCT FROM $6::bigint`,
		w.cfg.Group, b.Topic, b.Partition, next, b.Epoch, fence, b.TopicID)
	if err != nil {
		return fmt.Errorf("store offset: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	fe := &FencedError{Group: w.cfg.Group, Topic: b.Topic, Partition: b.Partition,
		Epoch: b.Epoch, Fence: b.Fence, Next: next, StoredEpoch: -1, StoredOffset: -1}
	err = tx.QueryRow(ctx, `SELECT epoch, coalesce(next_offset, -1) FROM `+w.offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, w.cfg.Group, b.Topic, b.Partition).Scan(&fe.StoredEpoch, &fe.StoredOffset)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("store offset: read the fence: %w", err)
	}
	return fe
}

// insertDeadLetters inserts dls, each sanitized (sanitizeDeadLetter),
// records of the topic whose Kafka id is topicID (not Valid: unknown), in
// tx, and returns those it inserted, sanitized. A record is named by its
// group, topic, partition, offset and topic id, NULL being an id of its
// own: a dead letter already there for the same record is not inserted
// again, and a row of another topic id (the topic deleted and recreated
// since) stands for another record.
func (w *Writer) insertDeadLetters(ctx context.Context, tx pgx.Tx, topicID uuid.NullUUID, dls []DeadLetter) ([]DeadLetter, error) {
	if len(dls) == 0 {
		return nil, nil
	}
	n := len(dls)
	topics, reasons := make([]string, n), make([]string, n)
	parts, offsets := make([]int32, n), make([]int64, n)
	ids := make([]pgtype.UUID, n) // binary encoding; uuid.NullUUID would be text
	keys, values := make([][]byte, n), make([][]byte, n)
	for i, d := range dls {
		d = sanitizeDeadLetter(d)
		topics[i], parts[i], offsets[i] = d.Topic, d.Partition, d.Offset
		ids[i] = pgtype.UUID{Bytes: d.EventID.UUID, Valid: d.EventID.Valid}
		reasons[i], keys[i], values[i] = d.Reason, d.Key, d.Value
	}
	rows, err := tx.Query(ctx, `INSERT INTO `+w.dead+`
(consumer_group, topic_id, topic, partition, "offset", event_id, reason, record_key, record_value)
SELECT $1, $9::uuid, d.* FROM unnest($2::text[], $3::int[], $4::bigint[], $5::uuid[], $6::text[], $7::bytea[], $8::bytea[])
  AS d(topic, partition, "offset", event_id, reason, record_key, record_value)
ON CONFLICT (consumer_group, topic, partition, "offset", topic_id) DO NOTHING
RETURNING topic, partition, "offset"`,
		w.cfg.Group, topics, parts, offsets, ids, reasons, keys, values, topicID)
	if err != nil {
		return nil, fmt.Errorf("insert dead letters: %w", err)
	}
	recorded, err := insertedDeadLetters(rows, dls)
	if err != nil {
		return nil, fmt.Errorf("insert dead letters: %w", err)
	}
	return recorded, nil
}

// logSkips logs dedup.skip for each skipped key (the first SkipLogLimit at
// Info, the rest at Debug) and records up to SkipEventLimit span events.
func (w *Writer) logSkips(ctx context.Context, b *Batch, skipped []skip) {
	if len(skipped) == 0 {
		return
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.Int("onceflow.skipped", len(skipped)))
	for i, s := range skipped {
		e := b.Events[s.event]
		level := slog.LevelInfo
		if i >= w.cfg.SkipLogLimit {
			level = slog.LevelDebug
		}
		if w.log.Enabled(ctx, level) {
			w.log.Log(ctx, level, "dedup.skip", "step", "dedup.skip", "event_id", s.key.EventID.String(),
				"bus", w.cfg.Bus, "handler", s.key.Handler, "layer", s.layer,
				"topic", e.Topic, "partition", e.Partition, "offset", e.Offset)
		}
		if i < w.cfg.SkipEventLimit {
			span.AddEvent("dedup.skip", trace.WithAttributes(
				attribute.String("onceflow.event_id", s.key.EventID.String()),
				attribute.String("onceflow.handler", s.key.Handler),
				attribute.String("onceflow.layer", s.layer)))
		}
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
