package main

import (
	"context"
	"fmt"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/config"
)

// newPool returns a pool on postgres.dsn without connecting: connections
// are opened when needed, so a service can start while Postgres is down
// (package pipeline waits for it; see pipeline.Runner.Run).
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
