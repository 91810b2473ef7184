package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/api"
)

// postgresCheck is /readyz's postgres check: ready when pool answers a
// ping. Its reason says what is wrong without the connection's details
// (user, database, host, port): /readyz is often open to more than the
// operators, and the logs name them.
func postgresCheck(pool *pgxpool.Pool) api.Check {
	return api.Check{Name: "postgres", Ready: func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
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
