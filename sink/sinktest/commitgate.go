package sinktest

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CommitGate holds back Postgres's answer to one COMMIT from its client:
// the transaction commits in Postgres while the client has not heard so,
// and a test can act then — cancel the context of the write, abort a
// member — as a crash or a cancel landing at that moment would. It works
// on connections made by GatedPool, with a DSN without TLS (it reads the
// COMMIT in the bytes sent). It is safe for concurrent use.
type CommitGate struct {
	armed    atomic.Bool
	sent     chan struct{} // closed when the armed COMMIT has been sent
	released chan struct{} // closed by Release
	sentOnce sync.Once
	relOnce  sync.Once
}

// GatedPool returns a pool on the test database, closed at cleanup, and
// the gate of its connections, released at cleanup.
func GatedPool(t testing.TB) (*pgxpool.Pool, *CommitGate) {
	t.Helper()
	g := &CommitGate{sent: make(chan struct{}), released: make(chan struct{})}
	cfg, err := pgxpool.ParseConfig(DSN(t))
	if err != nil {
		t.Fatalf("parse the test DSN: %v", err)
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gatedConn{Conn: c, g: g}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to test Postgres: %v", err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(g.Release) // runs first: a held connection can close
	return pool, g
}

// Arm makes the gate hold the answer to the next COMMIT sent on any of the
// pool's connections (one only), until Release.
func (g *CommitGate) Arm() { g.armed.Store(true) }

// Sent is closed once the armed COMMIT has been sent to Postgres.
func (g *CommitGate) Sent() <-chan struct{} { return g.sent }

// Release lets the held answer through. It is safe to call more than
// once.
func (g *CommitGate) Release() { g.relOnce.Do(func() { close(g.released) }) }

// gatedConn is a connection whose reads wait for the gate's release once
// it has sent the armed COMMIT.
type gatedConn struct {
	net.Conn
	g       *CommitGate
	holding atomic.Bool
}

// commitMessage is the simple-protocol query pgx sends for Tx.Commit.
var commitMessage = []byte("commit\x00")

func (c *gatedConn) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == 'Q' && bytes.HasSuffix(p, commitMessage) && c.g.armed.CompareAndSwap(true, false) {
		c.holding.Store(true) // before the COMMIT goes: its answer is held
		n, err := c.Conn.Write(p)
		c.g.sentOnce.Do(func() { close(c.g.sent) })
		return n, err
	}
	return c.Conn.Write(p)
}

func (c *gatedConn) Read(p []byte) (int, error) {
	if c.holding.Load() {
		<-c.g.released
		c.holding.Store(false)
	}
	return c.Conn.Read(p)
}
