package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// sqlHandlers builds the handlers of sql_handlers, in order. It does not
// touch the database: checkSQLHandlers does.
func (a *app) sqlHandlers() ([]*sink.SQLHandler, error) {
	var hs []*sink.SQLHandler
	var ps []error
	for i, c := range a.cfg.SQLHandlers {
		h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: c.Name, SQL: c.SQL, Topics: c.Topics,
			RawValues: a.cfg.Decode.Format == string(processor.FormatBytes)})
		if err != nil {
			ps = append(ps, fmt.Errorf("sql_handlers[%d]: %w", i, err))
			continue
		}
		hs = append(hs, h)
	}
	return hs, errors.Join(ps...)
}

// checkSQLHandlers asks Postgres whether each statement of sql_handlers
// can run (see sink.SQLHandler.Check) and returns every problem, each
// naming the handler with Postgres' message. Run it after the migrations.
func (a *app) checkSQLHandlers(ctx context.Context, pool *pgxpool.Pool) error {
	hs, err := a.sqlHandlers()
	if err != nil {
		return err
	}
	var ps []error
	for i, h := range hs {
		if err := h.Check(ctx, pool); err != nil {
			ps = append(ps, fmt.Errorf("sql_handlers[%d]: %w", i, err))
		}
	}
	return errors.Join(ps...)
}

// handlerNames is every handler's name: handlers, then sql_handlers.
func (a *app) handlerNames() []string {
	names := append([]string(nil), a.cfg.Handlers...)
	for _, h := range a.cfg.SQLHandlers {
		names = append(names, h.Name)
	}
	return names
}
