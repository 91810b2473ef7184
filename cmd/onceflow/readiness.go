package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/api"
)

// postgresCheck is /readyz's postgres check: ready when pool answers a
// ping. Its reason says what is wrong without the connection's details
// (user, database, host, port): /readyz is often open to more than the
// operators, and the logs name them.
//
// A pool whose every connection is in use (the partitions' batches, long
// on a slow link or a busy member) is ready when a connection was taken
// within the last txTimeout, the mark of a batch that ended (a batch's
// transaction ends within txTimeout while Postgres answers): a ping would
// queue behind the batches and run out of /readyz's time though Postgres
// answers them. When none was, the ping decides.
func postgresCheck(pool *pgxpool.Pool, txTimeout time.Duration) api.Check {
	var (
		mu      sync.Mutex
		taken   int64     // the pool's acquires, the checks' pings not counted
		takenAt time.Time // when taken last grew
	)
	return api.Check{Name: "postgres", Ready: func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		st := pool.Stat()
		if n := st.AcquireCount(); n > taken {
			taken, takenAt = n, time.Now()
		}
		busy := st.AcquiredConns() >= st.MaxConns()
		if busy && time.Since(takenAt) < txTimeout {
			return nil
		}
		err := pool.Ping(ctx)
		taken = max(taken, pool.Stat().AcquireCount()) // the ping's own acquire is no batch's
		if err != nil {
			if busy && errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("postgres does not answer: every connection of the pool is in a batch, and none ended for %v", txTimeout)
			}
			return errors.New(postgresDown(err))
		}
		return nil
	}}
}

// postgresDown says why a ping of Postgres failed, in words that carry no
// connection detail.
func postgresDown(err error) string {
	var (
		pg  *pgconn.PgError
		dns *net.DNSError
	)
	switch {
	case postgresTLSProblem(err) != "":
		return "postgres refuses the connection: " + postgresTLSProblem(err)
	case errors.As(err, &pg):
		switch {
		case pg.Code == "3D000":
			return "postgres refuses the login: the database does not exist (check postgres.dsn)"
		case len(pg.Code) == 5 && pg.Code[:2] == "28":
			return fmt.Sprintf("postgres refuses the login (SQLSTATE %s: check postgres.dsn's user and password)", pg.Code)
		case pg.Code == "57P03":
			return "postgres does not answer yet: it is starting up or shutting down"
		case pg.Code == "53300":
			return "postgres refuses connections: too many clients (max_connections)"
		}
		return fmt.Sprintf("postgres refuses the connection (SQLSTATE %s)", pg.Code)
	case errors.As(err, &dns):
		return "postgres does not answer: its host name does not resolve"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "postgres does not answer: connection refused"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return "postgres does not answer: no answer in time"
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return "postgres does not answer: no route to its host"
	case errors.Is(err, syscall.ECONNRESET):
		return "postgres does not answer: the connection was reset"
	}
	return "postgres does not answer"
}
