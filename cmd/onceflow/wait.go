package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/api"
	"github.com/onceflow/onceflow/config"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// newPool returns a pool on postgres.dsn without connecting: connections
// are opened when needed, so a service can start while Postgres is down.
func (a *app) newPool(size int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(a.cfg.Postgres.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres.dsn %s: not a valid connection string", config.RedactDSN(a.cfg.Postgres.DSN))
	}
	pc.MaxConns = int32(size)
	if a.tracing {
		pc.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(a.tp))
	}
	return pgxpool.NewWithConfig(context.Background(), pc)
}

// whenPostgres runs f (a ping, the migrations) until it succeeds, waiting
// with capped backoff while Postgres is down or starting, and logging what
// it waits for. An error that waiting cannot cure — a wrong password, an
// unknown database or role, a failing migration — is returned at once, as
// is ctx's end.
func (a *app) whenPostgres(ctx context.Context, what string, f func(context.Context) error) error {
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(cctx)
		cancel()
		switch {
		case err == nil:
			if attempt > 1 {
				a.log.Info("postgres answers", "dsn", config.RedactDSN(a.cfg.Postgres.DSN))
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case postgresTLSProblem(err) != "":
			return fmt.Errorf("%s: postgres at %s: %s: %s", what, config.RedactDSN(a.cfg.Postgres.DSN), postgresTLSProblem(err), redactErr(err, a.cfg.Postgres.DSN))
		case !postgresWaitable(err):
			return fmt.Errorf("%s: postgres at %s: %s", what, config.RedactDSN(a.cfg.Postgres.DSN), redactErr(err, a.cfg.Postgres.DSN))
		}
		a.log.Warn("waiting for postgres", "step", what, "dsn", config.RedactDSN(a.cfg.Postgres.DSN),
			"attempt", attempt, "retry_in", backoff, "err", redactErr(err, a.cfg.Postgres.DSN))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// postgresWaitable reports whether err goes away by waiting: Postgres down,
// starting, restarting, or out of connections. Authentication and unknown
// database or role errors are configuration, not waited for.
func postgresWaitable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "28", "3D": // invalid authorization, invalid catalog name
			return false
		}
	}
	return sink.IsTransient(err)
}

// consumerCheck is the readiness of a consumer that may not exist yet.
type consumerCheck struct {
	c atomic.Pointer[processor.Consumer]
}

func (k *consumerCheck) check() api.Check {
	return api.Check{Name: "kafka", Ready: func(context.Context) error {
		c := k.c.Load()
		if c == nil {
			return errors.New("the consumer has not started: waiting for postgres, then for the kafka brokers")
		}
		return c.Ready()
	}}
}
