package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// proxied starts a proxy in front of the test database and returns it with
// the DSN through it.
func proxied(t *testing.T) (*pgProxy, string) {
	t.Helper()
	dsn := sinktest.DSN(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	upstream := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	p, err := startProxy("127.0.0.1:0", upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	return p, strings.Replace(dsn, upstream, p.addr(), 1)
}

// insertTx inserts one email row for id in a transaction through dsn and
// commits; it returns the first error and the step that failed.
func insertTx(ctx context.Context, dsn, schema string, id uuid.UUID, extra int) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "connect", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "begin", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after a commit or a cut
	if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "emails_sent"}.Sanitize()+
		` (event_id, user_id, subject) VALUES ($1, 1, 'chaos')`, id); err != nil {
		return "insert", err
	}
	for i := range extra {
		if _, err := tx.Exec(ctx, `SELECT $1::int`, i); err != nil {
			return fmt.Sprintf("statement %d", i+1), err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return "commit", err
	}
	return "", nil
}

func committed(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID) bool {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{schema, "emails_sent"}.Sanitize()+
		` WHERE event_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestCutToxic proves that each cut lands where it says: the member's
// transaction fails at the named step, and Postgres did or did not commit.
func TestCutToxic(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	p, dsn := proxied(t)
	for _, tc := range []struct {
		mode      string
		skip      int
		extra     int
		failAt    string
		committed bool
	}{
		{cutBefore, 0, 0, "commit", false},
		{cutAfter, 0, 0, "commit", true},
		{cutMidTx, 0, 0, "insert", false},
		// The insert is two round trips on a new connection (prepare, then
		// execute): skipping two lands on the next statement.
		{cutMidTx, 2, 3, "statement 1", false},
	} {
		t.Run(fmt.Sprintf("%s skip %d", tc.mode, tc.skip), func(t *testing.T) {
			toxic, remove, err := p.install(tc.mode, 1, tc.skip)
			if err != nil {
				t.Fatal(err)
			}
			id := uuid.New()
			step, err := insertTx(t.Context(), dsn, schema, id, tc.extra)
			if rerr := remove(); rerr != nil {
				t.Fatal(rerr)
			}
			if step != tc.failAt || err == nil {
				t.Fatalf("the transaction failed at %q (%v), want at %q", step, err, tc.failAt)
			}
			if got := committed(t, pool, schema, id); got != tc.committed {
				t.Fatalf("postgres committed: %v, want %v", got, tc.committed)
			}
			if n := toxic.cuts.Load(); n != 1 {
				t.Fatalf("%d cuts counted, want 1", n)
			}
			// Once removed, the proxy lets transactions through.
			if step, err := insertTx(t.Context(), dsn, schema, uuid.New(), tc.extra); err != nil {
				t.Fatalf("after the toxic: failed at %s: %v", step, err)
			}
		})
	}
}

// TestCutToxicBudget: a toxic cuts at most its budget of connections.
func TestCutToxicBudget(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	p, dsn := proxied(t)
	toxic, remove, err := p.install(cutAfter, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer remove() //nolint:errcheck // the test's end
	var failed []int
	for i := range 4 {
		if _, err := insertTx(t.Context(), dsn, schema, uuid.New(), 0); err != nil {
			failed = append(failed, i)
		}
	}
	if len(failed) != 2 || failed[0] != 0 || failed[1] != 1 || toxic.cuts.Load() != 2 {
		t.Fatalf("transactions %v failed, %d cuts; want the first 2", failed, toxic.cuts.Load())
	}
}

// TestCutAll: every open connection is cut at once, idle ones included.
func TestCutAll(t *testing.T) {
	p, dsn := proxied(t)
	ctx := t.Context()
	var conns []*pgx.Conn
	for range 3 {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		conns = append(conns, c)
	}
	n, err := p.cut(ctx, cutAll, 1<<20, 0, 0)
	if err != nil || n != 3 {
		t.Fatalf("cut %d connections (%v), want 3", n, err)
	}
	for i, c := range conns {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Exec(qctx, "SELECT 1")
		cancel()
		if err == nil {
			t.Errorf("connection %d still answers after the cut", i)
		}
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("a new connection after the cut: %v", err)
	}
	c.Close(ctx)
}

// The latency toxic delays both directions of connections already open,
// and leaves them whole when it is removed.
func TestProxyLatency(t *testing.T) {
	p, dsn := proxied(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	const each = 40 * time.Millisecond
	remove, err := p.addLatency(each)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var one int
	if err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took < 2*each {
		t.Errorf("a round trip under %v each way took %v, less than both ways", each, took)
	}
	if err := remove(); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT 2`).Scan(&one); err != nil || one != 2 {
		t.Fatalf("after the latency was removed: %d, %v; want 2 on the same connection", one, err)
	}
}
