package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

const savepoint = "onceflow_isolate"

// denseAfter is how many events an isolation settles before it judges
// their culprits dense: from then on, while at least half of the events
// settled were culprits, a group that fails is tried event by event
// rather than halved. Halving finds k culprits among n in about
// 2k·log(n/k) groups, which is most when nearly all are culprits (2n−1
// groups for n); one by one costs n.
const denseAfter = 4

// errOutOfTime ends an isolation that used its share of the transaction's
// time, or whose caller must give the partition up (Batch.AllowPrefix,
// Batch.Stop).
var errOutOfTime = errors.New("isolation out of time")

// isolate applies todo event by event group under savepoints, halving
// groups that fail with a data error until each culprit is alone (or
// trying them one by one where culprits are dense), and turns the
// culprits into dead letters. Each group claims its keys inside its
// savepoint, in the batch's order of the groups, in one statement (hold
// looked them all up): a group rolled back leaves no claim, and a
// culprit's claims are never kept. Before the
// first group, every key of todo is held at once, in byte order (see
// hold), so that no group waits for another transaction's claim: two
// members isolating overlapping batches do not deadlock. Constraints are
// checked immediately, so a deferred constraint fails inside the
// savepoint of the events that violate it rather than at COMMIT. A
// non-data error ends the isolation and is returned.
//
// Groups are settled in the batch's order, so the events settled at any
// time are a prefix of todo's events. When stopAt is not zero and has
// passed, or stop is closed, as a group is about to start, and at least
// one event is settled, isolate starts no more groups: it returns the
// outcome of the events
// before that group's first event (their claims, their dead letters;
// culprits named beyond it are dropped, and found again by the batch that
// writes the rest) and that event's offset as next. Otherwise next is
// b.NextOffset. The dead letters returned are logged. failed is the data
// error b's plain transaction failed with (nil when isolate runs first,
// Batch.Isolate): when todo holds one event, that event is the culprit,
// dead-lettered with failed without a group.
func (w *Writer) isolate(ctx context.Context, tx pgx.Tx, b *Batch, todo []pending, stopAt time.Time, stop <-chan struct{}, failed error) (outcome, int64, error) {
	ctx, span := w.tracer.Start(ctx, "sink.isolate")
	defer span.End()
	fail := func(err error) (outcome, int64, error) {
		span.SetStatus(codes.Error, err.Error())
		return outcome{}, 0, err
	}
	is := &isolation{w: w, tx: tx, b: b, stopAt: stopAt, stop: stop, byEvent: map[int][]pending{}}
	if b.Isolate {
		is.seed = denseAfter // as if the batch went on from that many culprits
	}
	var events []int
	for _, p := range todo {
		if _, ok := is.byEvent[p.event]; !ok {
			events = append(events, p.event)
		}
		is.byEvent[p.event] = append(is.byEvent[p.event], p)
	}
	if len(events) > 0 {
		is.first = events[0]
	}
	next := b.NextOffset
	var err error
	if len(events) == 1 && failed != nil {
		// The plain transaction failed on the data of its lone event: no
		// group need try it again (over a slow link, a few round trips
		// fewer are what lets the transaction end in time).
		is.culprit(events[0], failed)
	} else {
		if is.held, err = w.hold(ctx, tx, todo); err != nil {
			return fail(fmt.Errorf("isolate: %w", err))
		}
		// One round trip: checks from now on are immediate, and the first
		// group's savepoint.
		if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE; SAVEPOINT `+savepoint); err != nil {
			return fail(fmt.Errorf("isolate: %w", err))
		}
		err = is.try(ctx, events)
	}
	if errors.Is(err, errOutOfTime) {
		// Culprits named beyond the cut are found again with the rest.
		next, err = b.Events[is.cut].Offset, nil
		is.culprits = slices.DeleteFunc(is.culprits, func(d DeadLetter) bool { return d.Offset >= next })
	}
	span.SetAttributes(attribute.Int("onceflow.savepoints", is.groups), attribute.Int("onceflow.dead_letters", len(is.culprits)),
		attribute.Int64("onceflow.isolated_to", next))
	if err != nil {
		return fail(err)
	}
	for _, d := range is.culprits {
		w.logDeadLetter(d)
	}
	is.out.dead = append(is.out.dead, is.culprits...)
	return is.out, next, nil
}

// isolation is the state of one isolate call.
type isolation struct {
	w       *Writer
	tx      pgx.Tx
	b       *Batch
	held    *held             // what hold learned: each group claims with it
	byEvent map[int][]pending // the keys of each event of todo
	first   int               // the first event of todo: no stop before it is settled
	stopAt  time.Time         // zero: never stop
	stop    <-chan struct{}   // closed: stop (as stopAt); nil: never
	// used: the savepoint holds a group that applied, so it is released
	// and set again before the next group (a failure then rolls back to
	// just before that group). After a rollback to it, it is set and
	// empty: the next group runs in it as it is.
	used bool

	out      outcome      // what the groups that applied did
	culprits []DeadLetter // the events that failed alone, logged once the isolation ends
	groups   int
	settled  int // events applied or dead-lettered
	seed     int // culprits assumed settled before the batch (Batch.Isolate)
	cut      int // with errOutOfTime: the first event left
}

// try settles evs, in order.
func (is *isolation) try(ctx context.Context, evs []int) error {
	if len(evs) == 0 {
		return nil
	}
	if evs[0] != is.first && is.outOfTime() {
		is.cut = evs[0]
		return errOutOfTime
	}
	err, fatal := is.group(ctx, evs)
	if fatal != nil {
		return fatal
	}
	if err == nil {
		is.settled += len(evs)
		return nil
	}
	if !IsData(err) {
		return err
	}
	// Events a handler named: set aside at once, all of them.
	if rs := rejects(err); len(rs) > 0 {
		rest := slices.Clone(evs)
		for _, r := range rs {
			if i := slices.IndexFunc(rest, func(e int) bool { return is.b.Events[e].ID == r.EventID }); i >= 0 {
				is.culprit(rest[i], r)
				rest = slices.Delete(rest, i, i+1)
			}
		}
		if len(rest) < len(evs) {
			return is.try(ctx, rest)
		}
	}
	if len(evs) == 1 {
		is.culprit(evs[0], err)
		return nil
	}
	if is.dense() {
		for i := range evs {
			if err := is.try(ctx, evs[i:i+1]); err != nil {
				return err
			}
		}
		return nil
	}
	mid := len(evs) / 2
	if err := is.try(ctx, evs[:mid]); err != nil {
		return err
	}
	return is.try(ctx, evs[mid:])
}

// outOfTime reports whether the isolation must start no more groups:
// stopAt has passed or stop is closed.
func (is *isolation) outOfTime() bool {
	return !is.stopAt.IsZero() && time.Now().After(is.stopAt) || closed(is.stop)
}

// group applies the events evs in the savepoint: err is the application's
// failure (the savepoint rolled back), fatal a failure of the
// transaction, which ends the isolation.
func (is *isolation) group(ctx context.Context, evs []int) (err, fatal error) {
	var keys []pending
	for _, e := range evs {
		keys = append(keys, is.byEvent[e]...)
	}
	if is.used {
		if _, err := is.tx.Exec(ctx, `RELEASE SAVEPOINT `+savepoint+`; SAVEPOINT `+savepoint); err != nil {
			return nil, fmt.Errorf("isolate: %w", err)
		}
		is.used = false
	}
	is.groups++
	o, err := is.w.apply(ctx, is.tx, is.b, keys, is.held)
	if err == nil {
		is.used = true
		is.out.merge(o)
		return nil, nil
	}
	if _, rerr := is.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT `+savepoint); rerr != nil {
		return nil, rollbackFailed(rerr, err)
	}
	return err, nil
}

// culprit makes event e, which failed alone with err, a dead letter.
func (is *isolation) culprit(e int, err error) {
	is.culprits = append(is.culprits, newDeadLetter(is.b, e, err))
	is.settled++
}

// dense reports whether culprits are dense among the events settled so
// far (see denseAfter).
func (is *isolation) dense() bool {
	settled, culprits := is.settled+is.seed, len(is.culprits)+is.seed
	return settled >= denseAfter && 2*culprits >= settled
}

// rollbackFailed is the error of an isolation whose ROLLBACK TO SAVEPOINT
// failed with rerr after a group failed with err: the transaction is lost,
// and its class is rerr's (a timeout, a connection lost: transient), not
// the group's data error, which is kept as text only.
func rollbackFailed(rerr, err error) error {
	return fmt.Errorf("isolate: %w (after %v)", rerr, err)
}
