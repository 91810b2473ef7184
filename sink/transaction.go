// The batch's transaction: Write, and the one transaction per batch it runs
// (apply or isolate, dead letters, the offset's compare-and-set, COMMIT),
// then the cache told and the slice's statistics seen to.

package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
)

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
// A batch with an event that another Write of this Writer is applying (a
// redelivery on another partition, read while its first delivery's
// transaction is open) begins its transaction only once that Write has
// returned, and then skips the event if the cache learned it committed:
// it waits holding nothing, where its claim would have waited in Postgres
// holding the keys claimed before it, and batches that need those would
// have queued behind it (a sink.wait_inflight span).
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
// [Result.NextOffset] says where the rest begins; it does so at once when
// [Batch.Stop] is closed. A timeout is never
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

	// Events another open transaction of this Writer claims: wait for it
	// to end, holding nothing, then ask the cache again.
	var h *holder
	for len(todo) > 0 {
		var busy <-chan struct{}
		if h, busy = w.inflight.enter(eventIDs(todo)); busy == nil {
			break
		}
		if err := w.waitInflight(ctx, busy); err != nil {
			return res, err
		}
		todo, skipped, conflicts = w.fromCache(b)
		res.SkippedLRU = len(skipped)
	}
	defer func() { w.inflight.leave(h) }() // on the paths that return before the cache is told

	res.Attempts++
	isolating := b.Isolate && len(todo) > 0
	out, err := w.transaction(ctx, b, todo, conflicts, isolating, nil)
	if err != nil && !isolating && isolatable(err) {
		w.log.Warn("batch failed on a data error; isolating the events that cause it",
			"topic", b.Topic, "partition", b.Partition, "offset", firstOffset(b), "batch_size", len(b.Events), "err", err)
		res.Attempts++
		out, err = w.transaction(ctx, b, todo, conflicts, true, err)
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
		msg := "isolation ran long: committed the records isolated so far; the rest follow in the next batch"
		if closed(b.Stop) {
			msg = "isolation cut short, the partition being given up: committed the records isolated so far; its next owner writes the rest"
		}
		w.log.Info(msg,
			"topic", b.Topic, "partition", b.Partition, "offset", firstOffset(b), "next_offset", out.next,
			"batch_size", len(b.Events), "dead_letters", len(out.dead))
	}
	// Committed: the keys claimed are known committed, with their digests.
	// The keys found claimed are too, but the cache is not told: in a
	// replay's re-read every key is found once, by a member whose cache
	// started empty, and remembering each would cost an insertion and
	// evict the member's own recent claims, which redeliveries hit.
	w.cfg.Cache.Remember(out.claimed, out.digests)
	w.inflight.leave(h) // whoever waited for these events finds them in the cache
	h = nil
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

// closed reports whether c is closed (never, when nil).
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func firstOffset(b *Batch) int64 {
	if len(b.Events) > 0 {
		return b.Events[0].Offset
	}
	return b.NextOffset
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
//
// failed, with isolate, is the data error the batch's plain transaction
// failed with (nil when there was none): when todo holds one event, that
// event is the culprit, and the isolation dead-letters it without trying
// it again.
func (w *Writer) transaction(ctx context.Context, b *Batch, todo []pending, conflicts []DeadLetter, isolate bool, failed error) (_ outcome, err error) {
	if isolate {
		parent := ctx
		defer func() {
			if err != nil && parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				err = &IsolationTimeoutError{TxTimeout: w.cfg.TxTimeout, Err: err}
			}
		}()
	}
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
		var stop <-chan struct{}
		if b.AllowPrefix {
			stopAt, stop = start.Add(w.cfg.TxTimeout/2), b.Stop
		}
		var next int64
		out, next, err = w.isolate(ctx, tx, b, todo, stopAt, stop, failed)
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
