package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tables names one schema's dedup tables.
type tables struct {
	schema    string
	processed string // sanitized, schema-qualified
	slices    string
	lockKey   string // hashed by Postgres into the slice lock's key
	maintKey  string // the same for the one-maintainer lock
}

func tablesOf(schema string) tables {
	return tables{
		schema:    schema,
		processed: pgx.Identifier{schema, "processed_events"}.Sanitize(),
		slices:    pgx.Identifier{schema, "processed_events_slices"}.Sanitize(),
		lockKey:   "onceflow.dedup.slices:" + schema,
		maintKey:  "onceflow.dedup.retention:" + schema,
	}
}

// slice is the sanitized name of slice n's partition.
func (t tables) slice(n int32) string {
	return pgx.Identifier{t.schema, sliceName(n)}.Sanitize()
}

// sliceName is the (unquoted) name of slice n's partition.
func sliceName(n int32) string { return fmt.Sprintf("processed_events_s%d", n) }

// pkeyName is the name of the primary key constraint of slice n's
// partition: the one a concurrent claim of the same key violates. The
// migration names slice 0's; rotate names the others'.
func pkeyName(n int32) string { return sliceName(n) + "_pkey" }

// lockSlices takes the slice lock shared until the end of the transaction
// and then reads the current slice and the oldest, in one round trip. The read is a
// statement of its own, so its snapshot is taken after the lock is held: a
// rotation that committed while this waited is seen; so is every statement
// pipelined after it (queueLock).
func (t tables) lockSlices(ctx context.Context, q Querier) (current, oldest int32, err error) {
	b := &pgx.Batch{}
	t.queueLock(b)
	br := q.SendBatch(ctx, b)
	defer br.Close()
	if current, oldest, err = t.readLock(br); err != nil {
		return 0, 0, err
	}
	return current, oldest, br.Close()
}

// queueLock queues lockSlices' two statements on b, for a caller that
// pipelines more after them; readLock reads their results.
func (t tables) queueLock(b *pgx.Batch) {
	b.Queue(`SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`, t.lockKey)
	b.Queue(`SELECT max(slice), min(slice), current_setting('transaction_isolation') FROM ` + t.slices)
}

func (t tables) readLock(br pgx.BatchResults) (current, oldest int32, err error) {
	if _, err := br.Exec(); err != nil {
		return 0, 0, fmt.Errorf("lock the dedup slices: %w", err)
	}
	var cur, old *int32
	var isolation string
	if err := br.QueryRow().Scan(&cur, &old, &isolation); err != nil {
		return 0, 0, fmt.Errorf("read the current dedup slice: %w", err)
	}
	if isolation != "read committed" {
		// A snapshot taken before the lock was granted would miss a
		// rotation that committed meanwhile, and claim in the old slice.
		return 0, 0, fmt.Errorf("the transaction is %s; a claim needs READ COMMITTED (its reads must see a rotation that committed while it waited)", strings.ToUpper(isolation))
	}
	if cur == nil || old == nil {
		return 0, 0, fmt.Errorf("read the current dedup slice: %s is empty (was it migrated?)", t.slices)
	}
	return *cur, *old, nil
}

// Retention keeps the dedup state of one schema within a horizon, by
// rotating and dropping slices of processed_events.
//
// # Design
//
// processed_events is partitioned by slice, a span of claim time (LIST
// partitions processed_events_s0, _s1, …; processed_events_slices lists
// the live ones and when each became current). A claim inserts into the
// current slice and looks its keys up in the older ones (see [Claim]).
// Step starts a new slice when the current one is Horizon/Slices old, and
// drops a slice once it ended Horizon ago: every row in it is then older
// than the horizon. Removing a day of keys is a DROP TABLE, which costs
// the same for a thousand rows or a billion: no long DELETE, no dead
// tuples for vacuum to find in the slices that stay, no index bloat. The
// price is paid at claim time: each older slice is one more index probe
// per new key (Slices = 1, the default, keeps one older slice, at most two
// while a drop is due), and the table holds up to Horizon + Horizon/Slices
// of claims.
//
// # Exactness within the horizon
//
// A key claimed at time t stays in processed_events until at least
// t + Horizon: its slice ends after t and is dropped no sooner than
// Horizon after it ends. So a duplicate that arrives within the horizon is
// always caught by Postgres; after it, it may be applied again (or still
// be caught: by a slice not yet dropped, or by a member's LRU). A
// rotation cannot let a key be claimed twice: the new slice becomes
// current under the slice lock held exclusively, which waits for every
// transaction that holds it shared (every claim in flight) to end, so no
// two transactions that both run claim different slices.
//
// # Locks and stalls
//
// A rotation and a drop each take a lock that every claim waits for: the
// slice lock, and the parent table's ACCESS EXCLUSIVE lock for DROP. Each
// waits at most LockTimeout for the transactions in flight, then gives
// up until the next Step, so claims stall at most LockTimeout, once per
// rotation or drop. Several members may run a Retention on one schema:
// one maintains at a time (an advisory lock), the others' Steps do
// nothing.
type Retention struct {
	Pool    *pgxpool.Pool // required
	Schema  string        // the tables' schema; default "public"
	Horizon time.Duration // required, > 0: how long a claim is kept at least
	// Slices is how many slices one horizon spans (default 1). More
	// slices keep less beyond the horizon and cost more probes per claim.
	Slices int
	// Interval is how often Run steps; default a tenth of a slice, between
	// 100ms and a minute.
	Interval time.Duration
	// LockTimeout bounds how long a rotation or a drop waits for the
	// claims in flight (and so how long they wait for it); default 1s.
	LockTimeout time.Duration
	// Hold, if set, is asked before slices are dropped; a non-empty
	// reason keeps every slice for this step (rotations go on). onceflow
	// holds drops while a replay has not caught up (sink.ReplayInProgress):
	// the claims it relies on must outlive its catch-up, however long.
	Hold   func(ctx context.Context) (reason string, err error)
	Logger *slog.Logger // nil discards
	// OnStep, if set, is called by Run after each step with what it
	// knows of the slices (metrics export it). It is called from Run's
	// goroutine, one call at a time, and must not block.
	OnStep func(RetentionStatus)
}

// RetentionStatus is Run's view of one schema's slices after a step: what
// an operator needs to see that slices are dropped and rotated on time.
type RetentionStatus struct {
	Schema string
	// Slices is how many slices live, as the last step that read them saw.
	Slices int
	// RotationDue is when the current slice is due to be replaced, and
	// DropDue when the oldest is due to be dropped (zero while one slice
	// lives), both on the local clock (Postgres' clock is read with the
	// slices, so the two clocks need not agree). Past due means a step
	// could not rotate or drop: held, busy or failing.
	RotationDue, DropDue time.Time
	// Held is Hold's reason when the last step that succeeded was kept
	// from dropping slices due; "" otherwise.
	Held string
	// Busy is how many steps in a row could not take their locks
	// (another maintainer, or a long transaction on processed_events).
	Busy int
	// Err is the last step's error, nil when it succeeded. A failed step
	// that could not read the slices leaves the other fields as the last
	// step that did saw them.
	Err error
}

// Defaults of Retention.
const (
	DefaultRetentionSlices      = 1
	DefaultRetentionLockTimeout = time.Second
	// MaxRetentionSlices bounds Slices: each older slice is one more
	// index probe per claimed key.
	MaxRetentionSlices = 24
)

func (r Retention) withDefaults() Retention {
	if r.Schema == "" {
		r.Schema = "public"
	}
	if r.Slices == 0 {
		r.Slices = DefaultRetentionSlices
	}
	if r.LockTimeout == 0 {
		r.LockTimeout = DefaultRetentionLockTimeout
	}
	if r.Interval == 0 && r.Slices > 0 {
		r.Interval = min(max(r.Horizon/time.Duration(r.Slices)/10, 100*time.Millisecond), time.Minute)
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return r
}

// Validate returns every problem with r (after defaults), each naming its
// field.
func (r Retention) Validate() error {
	r = r.withDefaults()
	var ps []error
	if r.Pool == nil {
		ps = append(ps, errors.New("dedup: Retention.Pool is required"))
	}
	if r.Horizon <= 0 {
		ps = append(ps, fmt.Errorf("dedup: Retention.Horizon must be > 0, got %v", r.Horizon))
	}
	if r.Slices < 1 || r.Slices > MaxRetentionSlices {
		ps = append(ps, fmt.Errorf("dedup: Retention.Slices must be between 1 and %d, got %d", MaxRetentionSlices, r.Slices))
	}
	if r.Interval < 0 {
		ps = append(ps, fmt.Errorf("dedup: Retention.Interval %v is negative", r.Interval))
	}
	if r.LockTimeout < 0 {
		ps = append(ps, fmt.Errorf("dedup: Retention.LockTimeout %v is negative", r.LockTimeout))
	}
	return errors.Join(ps...)
}

// Width is how long one slice is current: Horizon / Slices.
func (r Retention) Width() time.Duration {
	r = r.withDefaults()
	if r.Slices < 1 {
		return r.Horizon
	}
	return r.Horizon / time.Duration(r.Slices)
}

// StepResult says what one Step did.
type StepResult struct {
	Current int32   // the current slice after the step
	Rotated bool    // a new slice became current
	Dropped []int32 // slices dropped, past the horizon
	// Busy is set when another maintainer held the maintenance lock, or a
	// lock could not be had within LockTimeout: the step is retried by the
	// next one.
	Busy bool
	// Held is Hold's reason when it kept slices due for dropping.
	Held string
	// Slices is how many slices live after the step; RotationDue and
	// DropDue are as in RetentionStatus. Zero when the step failed before
	// it read the slices.
	Slices               int
	RotationDue, DropDue time.Time
}

// Run steps every Interval until ctx ends, logging what each step did and
// any error (an error does not end it: Postgres down is waited out). It
// returns nil when ctx ends, or the configuration's problems at once.
func (r Retention) Run(ctx context.Context) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.withDefaults()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	// A failing step is logged as a warning when it starts failing (often
	// Postgres restarting), and as an error once it has failed for a
	// minute and then every 5 minutes while it goes on (a missing
	// privilege does not cure itself, and the table grows meanwhile).
	var since, nextError, nextBusy time.Time
	var busy int
	var held string
	status := RetentionStatus{Schema: r.Schema}
	for {
		res, err := r.Step(ctx)
		if r.OnStep != nil && ctx.Err() == nil {
			if res.Slices > 0 {
				status.Slices, status.RotationDue, status.DropDue = res.Slices, res.RotationDue, res.DropDue
			}
			if err == nil {
				status.Held = res.Held
				if res.Busy {
					status.Busy++
				} else {
					status.Busy = 0
				}
			}
			status.Err = err
			r.OnStep(status)
		}
		if err == nil {
			if res.Held != held {
				if res.Held != "" {
					r.Logger.Info("dedup retention: dropping slices is held", "schema", r.Schema, "reason", res.Held)
				} else {
					r.Logger.Info("dedup retention: dropping slices is no longer held", "schema", r.Schema)
				}
				held = res.Held
			}
			// A lock not had within LockTimeout a few times in a row: a
			// long transaction on processed_events (a dump, a report)
			// blocks rotations or drops, and claims wait each time.
			if res.Busy {
				busy++
			} else {
				busy = 0
			}
			if busy >= 3 && time.Now().After(nextBusy) {
				nextBusy = time.Now().Add(5 * time.Minute)
				r.Logger.Warn("dedup retention: a rotation or drop keeps waiting for its locks (another maintainer, or a long transaction reading processed_events); claims wait up to lock_timeout at each attempt",
					"schema", r.Schema, "attempts", busy, "lock_timeout", r.LockTimeout)
			}
		}
		switch {
		case err == nil || ctx.Err() != nil:
			since = time.Time{}
		case since.IsZero():
			since, nextError = time.Now(), time.Now().Add(time.Minute)
			r.Logger.Warn("dedup retention: step failed; retrying", "schema", r.Schema, "err", err)
		case time.Now().After(nextError):
			nextError = time.Now().Add(5 * time.Minute)
			r.Logger.Error("dedup retention: failing; claims past the horizon are kept meanwhile", "schema", r.Schema,
				"failing_for", time.Since(since).Round(time.Second), "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// slicesState is processed_events_slices as read by Step.
type slicesState struct {
	ids    []int32
	starts []time.Time
	now    time.Time // the server's clock
	local  time.Time // the local clock, once the read returned
}

// due fills res's Slices, RotationDue and DropDue from st, less the
// first dropped slices (dropped by the step after st was read).
func (r Retention) due(st slicesState, dropped int, res *StepResult) {
	if len(st.ids) == 0 || dropped >= len(st.ids) {
		return
	}
	starts := st.starts[dropped:]
	local := func(server time.Time) time.Time { return st.local.Add(server.Sub(st.now)) }
	res.Slices = len(starts)
	res.RotationDue = local(starts[len(starts)-1].Add(r.Width()))
	if len(starts) > 1 {
		// Slice 0 ends when slice 1 starts, and is dropped Horizon later.
		res.DropDue = local(starts[1].Add(r.Horizon))
	}
}

// Step starts a new slice if the current one is Width old, then drops the
// slices that ended Horizon ago or more. Each runs in a transaction of its
// own, under the maintenance lock; see [Retention] for the locks. The
// result says when the next rotation and drop are due.
func (r Retention) Step(ctx context.Context) (StepResult, error) {
	if err := r.Validate(); err != nil {
		return StepResult{}, err
	}
	r = r.withDefaults()
	var st slicesState
	res, err := r.step(ctx, &st)
	r.due(st, len(res.Dropped), &res)
	return res, err
}

// step is Step; *st is the slices as last read.
func (r Retention) step(ctx context.Context, last *slicesState) (StepResult, error) {
	t := tablesOf(r.Schema)
	st, err := r.read(ctx, t)
	if err != nil {
		return StepResult{}, err
	}
	*last = st
	res := StepResult{Current: st.ids[len(st.ids)-1]}
	if st.now.Sub(st.starts[len(st.starts)-1]) >= r.Width() {
		done, err := r.rotate(ctx, t, res.Current)
		if err != nil {
			return res, err
		}
		if !done {
			res.Busy = true
			return res, nil
		}
		res.Rotated, res.Current = true, res.Current+1
		r.Logger.Log(ctx, r.sliceLogLevel(), "dedup slice started", "schema", r.Schema, "slice", res.Current, "width", r.Width())
		if st, err = r.read(ctx, t); err != nil {
			*last = slicesState{}
			return res, err
		}
		*last = st
	}
	// Slice i ends when slice i+1 starts; the current one never ends.
	for i := 0; i+1 < len(st.ids); i++ {
		if st.now.Sub(st.starts[i+1]) < r.Horizon {
			break
		}
		done, err := r.drop(ctx, t, st.ids[i])
		var held *heldError
		if errors.As(err, &held) {
			res.Held = held.reason
			return res, nil
		}
		if err != nil {
			return res, err
		}
		if !done {
			res.Busy = true
			return res, nil
		}
		res.Dropped = append(res.Dropped, st.ids[i])
		r.Logger.Log(ctx, r.sliceLogLevel(), "dedup slice dropped: its claims are past the horizon", "schema", r.Schema,
			"slice", st.ids[i], "ended", st.starts[i+1].UTC().Format(time.RFC3339), "horizon", r.Horizon)
	}
	return res, nil
}

// sliceLogLevel is Info for slices of a minute or more, Debug for
// shorter ones (tests, benchmarks), which would flood the log.
func (r Retention) sliceLogLevel() slog.Level {
	if r.Width() < time.Minute {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// read returns the live slices, oldest first, and the server's clock.
func (r Retention) read(ctx context.Context, t tables) (slicesState, error) {
	var st slicesState
	err := r.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(slice ORDER BY slice), '{}'),
    coalesce(array_agg(started_at ORDER BY slice), '{}'), clock_timestamp() FROM `+t.slices).
		Scan(&st.ids, &st.starts, &st.now)
	if err != nil {
		return st, fmt.Errorf("dedup retention: read %s: %w", t.slices, err)
	}
	if len(st.ids) == 0 || len(st.ids) != len(st.starts) {
		return slicesState{}, fmt.Errorf("dedup retention: %s is empty (was it migrated?)", t.slices)
	}
	st.local = time.Now()
	return st, nil
}

// maintain runs f in a transaction holding the maintenance lock, with
// lock_timeout set. It reports false, with no error, when another
// maintainer holds the lock or a lock timed out.
func (r Retention) maintain(ctx context.Context, t tables, f func(tx pgx.Tx) error) (bool, error) {
	done := false
	err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(r.LockTimeout.Milliseconds(), 1))); err != nil {
			return err
		}
		var mine bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, t.maintKey).Scan(&mine); err != nil {
			return err
		}
		if !mine {
			return nil
		}
		if err := f(tx); err != nil {
			return err
		}
		done = true
		return nil
	})
	if isLockTimeout(err) {
		return false, nil
	}
	return done && err == nil, err
}

// rotate makes slice current+1 current, unless current is no longer the
// current slice (another maintainer rotated).
func (r Retention) rotate(ctx context.Context, t tables, current int32) (bool, error) {
	next := current + 1
	ok, err := r.maintain(ctx, t, func(tx pgx.Tx) error {
		var now int32
		if err := tx.QueryRow(ctx, `SELECT max(slice) FROM `+t.slices).Scan(&now); err != nil {
			return err
		}
		if now != current {
			return errRotated
		}
		// The partition is created and attached before the slice lock is
		// taken (ATTACH takes SHARE UPDATE EXCLUSIVE on the parent, which
		// claims do not wait for), so claims wait only for the insert.
		for _, stmt := range []string{
			// The primary key is named here, not left for ATTACH to name:
			// a claim tells a concurrent claim by it (copyClaims). ATTACH
			// takes it as the partition's index of the parent's key.
			`CREATE TABLE ` + t.slice(next) + ` (LIKE ` + t.processed + ` INCLUDING DEFAULTS, CONSTRAINT ` +
				pgx.Identifier{pkeyName(next)}.Sanitize() + ` PRIMARY KEY (event_id, handler, slice))`,
			fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES IN (%d)`, t.processed, t.slice(next), next),
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		// Claims insert into the slice directly: whoever may write the
		// parent may write the slice.
		if err := copyGrants(ctx, tx, t.processed, t.slice(next)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, t.lockKey); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+t.slices+` (slice, started_at) VALUES ($1, clock_timestamp())`, next)
		return err
	})
	if errors.Is(err, errRotated) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("dedup retention: start slice %d: %w", next, err)
	}
	return ok, nil
}

var errRotated = errors.New("another maintainer rotated")

// copyGrants grants on to what is granted on from, its owner's privileges
// aside.
func copyGrants(ctx context.Context, tx pgx.Tx, from, to string) error {
	rows, err := tx.Query(ctx, `SELECT a.privilege_type,
    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a LEFT JOIN pg_roles r ON r.oid = a.grantee
WHERE c.oid = $1::regclass AND a.grantee <> c.relowner`, from)
	if err != nil {
		return err
	}
	grants, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Privilege, Grantee string }])
	if err != nil {
		return err
	}
	for _, g := range grants {
		if _, err := tx.Exec(ctx, `GRANT `+g.Privilege+` ON `+to+` TO `+g.Grantee); err != nil {
			return err
		}
	}
	return nil
}

// drop drops slice n's partition and its row.
func (r Retention) drop(ctx context.Context, t tables, n int32) (bool, error) {
	ok, err := r.maintain(ctx, t, func(tx pgx.Tx) error {
		// Asked under the maintenance lock, which a rewind takes too
		// (LockRetention): a rewind either committed before, and holds
		// the drop, or waits and then sees the slice gone.
		if r.Hold != nil {
			reason, err := r.Hold(ctx)
			if err != nil {
				return err
			}
			if reason != "" {
				return &heldError{reason}
			}
		}
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+t.slice(n)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM `+t.slices+` WHERE slice = $1`, n)
		return err
	})
	var held *heldError
	if errors.As(err, &held) {
		return false, err
	}
	if err != nil {
		return false, fmt.Errorf("dedup retention: drop slice %d: %w", n, err)
	}
	return ok, nil
}

// heldError is a drop Hold kept from happening.
type heldError struct{ reason string }

func (e *heldError) Error() string { return "dropping slices is held: " + e.reason }

// LockRetention takes, until the end of q's transaction, the lock under
// which Retention starts and drops slices: none is started or dropped
// until then. A rewind takes it to read the slices still kept and record
// itself in one step that no drop can slip into.
func LockRetention(ctx context.Context, q Querier, schema string) error {
	rows, err := q.Query(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, tablesOf(schema).maintKey)
	if err != nil {
		return fmt.Errorf("lock dedup retention: %w", err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("lock dedup retention: %w", err)
	}
	return nil
}

// isLockTimeout reports whether err is Postgres' lock_not_available
// (lock_timeout expired, 55P03).
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}
