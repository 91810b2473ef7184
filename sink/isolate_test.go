package sink_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func TestClassify(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("handler h: %w", &pgconn.PgError{Code: code, Message: "m"}) }
	for _, tc := range []struct {
		name string
		err  error
		want sink.Class
	}{
		{"connection failure 08006", pg("08006"), sink.Transient},
		{"admin shutdown 57P01", pg("57P01"), sink.Transient},
		{"crash shutdown 57P02", pg("57P02"), sink.Transient},
		{"cannot connect now 57P03", pg("57P03"), sink.Transient},
		{"serialization failure 40001", pg("40001"), sink.Transient},
		{"deadlock 40P01", pg("40P01"), sink.Transient},
		{"lock timeout 55P03", pg("55P03"), sink.Transient},
		{"statement timeout 57014", pg("57014"), sink.Transient},
		{"disk full 53100", pg("53100"), sink.Transient},
		{"too many connections 53300", pg("53300"), sink.Transient},
		{"io error 58030", pg("58030"), sink.Transient},
		{"read-only transaction 25006", pg("25006"), sink.Transient},
		{"numeric out of range 22003", pg("22003"), sink.Data},
		{"invalid text representation 22P02", pg("22P02"), sink.Data},
		{"not null violation 23502", pg("23502"), sink.Data},
		{"unique violation 23505", pg("23505"), sink.Data},
		{"foreign key violation 23503", pg("23503"), sink.Data},
		{"check violation 23514", pg("23514"), sink.Data},
		{"index row too large 54000", pg("54000"), sink.Data},
		{"cardinality violation 21000", pg("21000"), sink.Data},
		{"raise exception P0001", pg("P0001"), sink.Data},
		{"undefined table 42P01", pg("42P01"), sink.Unknown},
		{"undefined column 42703", pg("42703"), sink.Unknown},
		{"insufficient privilege 42501", pg("42501"), sink.Unknown},
		{"internal error XX000", pg("XX000"), sink.Unknown},
		{"reject", fmt.Errorf("handler h: %w", &sink.RejectError{EventID: uuid.New(), Reason: "bad"}), sink.Data},
		{"fenced", fmt.Errorf("x: %w", &sink.FencedError{}), sink.Fenced},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), sink.Canceled},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), sink.Transient},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), sink.Transient},
		{"network", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, sink.Transient},
		{"connect error", &pgconn.ConnectError{}, sink.Transient},
		{"handler's own error", errors.New("template not found"), sink.Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sink.Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// A connection the server ended (a FATAL error: an idle transaction past
// idle_in_transaction_session_timeout, a transaction past
// transaction_timeout, an idle session past idle_session_timeout, an
// administrator's pg_terminate_backend, a shutdown) is transient whatever
// step of the batch met it: the batch is written again on a new
// connection.
func TestClassifyTerminatedConnection(t *testing.T) {
	fatal := func(code string) *pgconn.PgError {
		return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "terminating connection"}
	}
	for _, code := range []string{
		"25P03", // idle_in_transaction_session_timeout
		"25P04", // transaction_timeout (PostgreSQL 17)
		"57P05", // idle_session_timeout
		"57P01", // admin_shutdown, pg_terminate_backend
		"57P02", // crash_shutdown
		"57P03", // cannot_connect_now
		"08006", // connection_failure
		"08003", // connection_does_not_exist
		"08P01", // protocol_violation
	} {
		for _, step := range []string{"claim events", "read payload digests: look up claims", "handler h", "store offset", "commit"} {
			t.Run(code+" "+step, func(t *testing.T) {
				err := fmt.Errorf("%s: %w", step, fatal(code))
				if got := sink.Classify(err); got != sink.Transient {
					t.Errorf("Classify(%v) = %v, want %v", err, got, sink.Transient)
				}
			})
		}
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"conn closed", fmt.Errorf("store offset: %w", pgconn.ErrConnClosed)},
		{"conn closed, rollback", errors.Join(fmt.Errorf("commit: %w", fatal("25P03")), fmt.Errorf("rollback: %w", pgconn.ErrConnClosed))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sink.Classify(tc.err); got != sink.Transient {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, sink.Transient)
			}
		})
	}
}

func TestIsTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"transaction deadline", fmt.Errorf("handler h: timeout: %w", context.DeadlineExceeded), true},
		{"statement timeout 57014", fmt.Errorf("handler h: %w", &pgconn.PgError{Code: "57014"}), true},
		{"lock timeout 55P03", fmt.Errorf("handler h: %w", &pgconn.PgError{Code: "55P03"}), false},
		{"data error", fmt.Errorf("handler h: %w", &pgconn.PgError{Code: "22P02"}), false},
		{"connection lost", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sink.IsTimeout(tc.err); got != tc.want {
				t.Errorf("IsTimeout(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// randomText returns n random letters: text no compression makes small.
func randomText(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(rand.IntN(26))
	}
	return string(b)
}

// counting counts the events each Apply call receives.
type counting struct {
	calls int
}

func (*counting) Name() string { return "counting" }

func (c *counting) Apply(context.Context, pgx.Tx, []sink.Event) error {
	c.calls++
	return nil
}

// A batch holding an event that fails in Postgres (an item too long for
// the inventory index, SQLSTATE 54000) and one its handler rejects commits
// every other event once; the two culprits are dead letters with their
// reasons and apply nothing, for any handler.
func TestWriteIsolatesDataErrors(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	probe := &counting{}
	w := newWriter(t, pool, schema, nil, probe)
	epoch := take(t, w)

	const n = 64
	var ids []uuid.UUID
	var vals [][]byte
	want := map[uuid.UUID]orders.Order{}
	long, rejected := uuid.New(), uuid.New()
	for i := range n {
		switch i {
		case 17:
			ids, vals = append(ids, long), append(vals, order(5, randomText(10000)))
		case 40:
			ids, vals = append(ids, rejected), append(vals, []byte(`{"user_id":"five","items":["A"]}`))
		default:
			id := uuid.New()
			o := orders.Order{UserID: int64(i + 1), Items: []string{"A", fmt.Sprintf("SKU-%d", i%5)}}
			ids, vals = append(ids, id), append(vals, order(o.UserID, o.Items...))
			want[id] = o
		}
	}
	res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: n, Events: events(0, ids, vals)})
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if res.Attempts != 2 || len(res.Rejected) != 2 || res.Applied != (n-2)*5 {
		t.Errorf("result: attempts %d, dead-lettered %d, applied %d; want 2, 2, %d", res.Attempts, len(res.Rejected), res.Applied, (n-2)*5)
	}
	reasons := map[uuid.UUID]string{}
	for _, d := range res.Rejected {
		reasons[d.EventID.UUID] = d.Reason
	}
	if !strings.Contains(reasons[long], "SQLSTATE 54000") || !strings.Contains(reasons[long], "inventoryHandler") {
		t.Errorf("reason for the long item = %q, want the handler and SQLSTATE 54000", reasons[long])
	}
	if !strings.HasPrefix(reasons[rejected], "rejected: not an order") {
		t.Errorf("reason for the rejected order = %q", reasons[rejected])
	}
	// Isolation costs O(k log n) handler calls, not n.
	if probe.calls > 2+2*2*7 {
		t.Errorf("the probe handler was called %d times to isolate 2 events among %d", probe.calls, n)
	}
	rep, err := orders.Check(ctx, pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
	for _, id := range []uuid.UUID{long, rejected} {
		if c := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.processed_events WHERE event_id = $1`, id); c != 0 {
			t.Errorf("culprit %s has %d processed rows, want 0", id, c)
		}
		if c := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1`, id); c != 1 {
			t.Errorf("culprit %s has %d dead letters, want 1", id, c)
		}
	}
	if c := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets WHERE partition = 0`); c != n {
		t.Errorf("stored offset = %d, want %d", c, n)
	}
}

// Rejects a handler names all at once (errors.Join) are set aside in one
// step: ten bad orders among a hundred cost the probe handler two calls in
// the isolating transaction (the first try and the rest), not a bisection.
func TestWriteSetsAsideJoinedRejects(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	probe := &counting{}
	w := newWriter(t, pool, schema, nil, probe)
	epoch := take(t, w)

	const n = 100
	var ids []uuid.UUID
	var vals [][]byte
	want := map[uuid.UUID]orders.Order{}
	bad := map[uuid.UUID]bool{}
	for i := range n {
		id := uuid.New()
		ids = append(ids, id)
		if i%10 == 3 {
			vals = append(vals, []byte(`{"user_id":0,"items":["A"]}`))
			bad[id] = true
			continue
		}
		o := orders.Order{UserID: int64(i + 1), Items: []string{"A"}}
		vals = append(vals, order(o.UserID, o.Items...))
		want[id] = o
	}
	res, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: n, Events: events(0, ids, vals)})
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if len(res.Rejected) != len(bad) || res.Applied != (n-len(bad))*5 {
		t.Errorf("result: dead-lettered %d, applied %d; want %d, %d", len(res.Rejected), res.Applied, len(bad), (n-len(bad))*5)
	}
	for _, d := range res.Rejected {
		if !bad[d.EventID.UUID] || !strings.HasPrefix(d.Reason, "rejected: ") {
			t.Errorf("dead letter %s with reason %q, want one of the bad orders, rejected", d.EventID.UUID, d.Reason)
		}
	}
	if probe.calls > 3 { // the first transaction, then the isolating one's two tries
		t.Errorf("the probe handler was called %d times to set aside %d named rejects", probe.calls, len(bad))
	}
	rep, err := orders.Check(t.Context(), pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}

// refHandler writes one row per event into a table whose foreign key is
// checked at COMMIT (deferred): an event naming an unknown user violates it
// only then.
type refHandler struct{ table string }

func (refHandler) Name() string { return "refHandler" }

func (h refHandler) Apply(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
	users := make([]int64, len(events))
	for i, e := range events {
		o, err := orders.Parse(e.Value)
		if err != nil {
			return &sink.RejectError{EventID: e.ID, Reason: err.Error()}
		}
		users[i] = o.UserID
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+h.table+` (user_id) SELECT * FROM unnest($1::bigint[])`, users)
	return err
}

// A deferred constraint that fails at COMMIT because of one event is
// attributed to that event: it becomes a dead letter (SQLSTATE 23503) and
// the rest of the batch commits.
func TestWriteIsolatesDeferredConstraint(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	for _, sql := range []string{
		`CREATE TABLE ` + schema + `.users (id bigint PRIMARY KEY)`,
		`INSERT INTO ` + schema + `.users SELECT generate_series(1, 100)`,
		`CREATE TABLE ` + schema + `.refs (user_id bigint REFERENCES ` + schema + `.users (id) DEFERRABLE INITIALLY DEFERRED)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: []sink.Handler{refHandler{schema + ".refs"}}})
	if err != nil {
		t.Fatal(err)
	}
	epoch := take(t, w)
	var ids []uuid.UUID
	var vals [][]byte
	for i := range 10 {
		user := int64(i + 1)
		if i == 6 {
			user = 1000 // no such user
		}
		ids, vals = append(ids, uuid.New()), append(vals, order(user, "A"))
	}
	res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 10, Events: events(0, ids, vals)})
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if len(res.Rejected) != 1 || res.Rejected[0].EventID.UUID != ids[6] || !strings.Contains(res.Rejected[0].Reason, "SQLSTATE 23503") {
		t.Fatalf("dead-lettered %+v, want event 6 with SQLSTATE 23503", res.Rejected)
	}
	if c := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.refs`); c != 9 {
		t.Errorf("refs rows = %d, want 9", c)
	}
}

// An event twice in a batch (a corrected version after the first) whose
// first copy fails alone: the first copy is a dead letter and leaves no
// claim; the second claims the key inside the isolating transaction, with
// its own payload's digest, and applies once. The keys the isolating
// transaction holds before its first savepoint are no claims of its own.
func TestWriteIsolatesFirstCopyOfRepeat(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	exec(t, pool, `CREATE TABLE `+effects+` (event_id uuid, "offset" bigint)`)
	h := sink.HandlerFunc("h", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
		ids, offsets := make([]uuid.UUID, len(events)), make([]int64, len(events))
		for i, e := range events {
			if e.Offset == 0 {
				_, err := tx.Exec(ctx, `SELECT 1/0`)
				return err
			}
			ids[i], offsets[i] = e.ID, e.Offset
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` SELECT * FROM unnest($1::uuid[], $2::bigint[])`, ids, offsets)
		return err
	})
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: []sink.Handler{h}})
	if err != nil {
		t.Fatal(err)
	}
	epoch := take(t, w)
	e, f := uuid.New(), uuid.New()
	vals := [][]byte{[]byte(`{"v":1}`), []byte(`{"v":2}`), []byte(`{}`)}
	res, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 3,
		Events: events(0, []uuid.UUID{e, e, f}, vals)})
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if res.Attempts != 2 || res.Applied != 2 || res.Conflicts != 0 || len(res.Rejected) != 1 || res.Rejected[0].Offset != 0 {
		t.Errorf("result: attempts %d, applied %d, conflicts %d, dead letters %+v; want 2, 2, 0, offset 0",
			res.Attempts, res.Applied, res.Conflicts, res.Rejected)
	}
	for _, c := range []struct {
		what string
		sql  string
		want int64
	}{
		{"effects of offset 1", `SELECT count(*) FROM ` + effects + ` WHERE event_id = $1 AND "offset" = 1`, 1},
		{"effects of the event", `SELECT count(*) FROM ` + effects + ` WHERE event_id = $1`, 1},
		{"claims of the event", `SELECT count(*) FROM ` + schema + `.processed_events WHERE event_id = $1`, 1},
		{"dead letters of the event", `SELECT count(*) FROM ` + schema + `.dead_letters WHERE event_id = $1 AND "offset" = 0`, 1},
	} {
		if n := sinktest.Count(t, pool, c.sql, e); n != c.want {
			t.Errorf("%s: %d, want %d", c.what, n, c.want)
		}
	}
	var stored []byte
	if err := pool.QueryRow(t.Context(), `SELECT payload_digest FROM `+schema+`.processed_events WHERE event_id = $1`, e).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if want := dedup.PayloadDigest(vals[1]); string(stored) != string(want[:]) {
		t.Errorf("stored digest %x, want the second copy's %x", stored, want)
	}
}

// stalling stalls its first Apply for d without a statement, as a process
// frozen (SIGSTOP) in the middle of a batch's transaction does.
type stalling struct {
	d     time.Duration
	calls int
}

func (*stalling) Name() string { return "stalling" }

func (s *stalling) Apply(context.Context, pgx.Tx, []sink.Event) error {
	if s.calls++; s.calls == 1 {
		time.Sleep(s.d)
	}
	return nil
}

// A batch whose connection Postgres ended because the transaction sat idle
// past postgres.idle_in_transaction_timeout (SQLSTATE 25P03, what a member
// frozen mid-batch meets when it resumes) fails transient, with nothing
// written, and the same batch then commits once on a new connection.
func TestWriteIdleInTransactionTimeoutIsTransient(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	stall := &stalling{d: time.Second}
	w := writerWith(t, pool, schema, sink.Config{Handlers: []sink.Handler{stall},
		IdleTimeout: 100 * time.Millisecond})
	epoch := take(t, w)

	id := uuid.New()
	b := &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: -1, NextOffset: 1,
		Events: events(0, []uuid.UUID{id}, [][]byte{order(1, "A")})}
	_, err := w.Write(ctx, b)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25P03" {
		t.Fatalf("first write: err = %v, want SQLSTATE 25P03", err)
	}
	if got := sink.Classify(err); got != sink.Transient {
		t.Errorf("Classify(%v) = %v, want %v", err, got, sink.Transient)
	}
	if _, err := w.Write(ctx, b); err != nil {
		t.Fatalf("second write: %v", err)
	}
	rep, err := orders.Check(ctx, pool, schema, map[uuid.UUID]orders.Order{id: {UserID: 1, Items: []string{"A"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects after the retry not exactly once: %v", rep.Problems)
	}
}
