package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	pgmigrate "github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/sink"
)

// handlerRegistry is every Go handler this program can run, by name, and
// the migrations of their tables: the handlers key chooses among them.
// The demo business (package orders) is registered in it the way a user's
// handlers would be, and nothing else in the command names it; a program
// embedding onceflow with its own handlers needs no registry and calls
// package pipeline directly (examples/customhandler).
type handlerRegistry struct {
	names      []string // in registration order: the default of the handlers key
	ctors      map[string]func(schema string) sink.Handler
	migrations []pgmigrate.Func // the registered handlers' tables, in registration order
}

func (r *handlerRegistry) add(name string, ctor func(schema string) sink.Handler) {
	if r.ctors == nil {
		r.ctors = map[string]func(string) sink.Handler{}
	}
	r.names = append(r.names, name)
	r.ctors[name] = ctor
}

// addMigration registers the migration of registered handlers' tables.
func (r *handlerRegistry) addMigration(m pgmigrate.Func) { r.migrations = append(r.migrations, m) }

// migrate creates or upgrades every registered handler's tables in schema.
func (r *handlerRegistry) migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	for _, m := range r.migrations {
		if err := m(ctx, pool, schema); err != nil {
			return err
		}
	}
	return nil
}

// registry has the demo business's four handlers and their tables.
var registry = func() *handlerRegistry {
	r := &handlerRegistry{}
	for _, name := range orders.Names {
		r.add(name, func(schema string) sink.Handler { h, _ := orders.New(name, schema); return h })
	}
	r.addMigration(orders.Migrate)
	return r
}()

// check returns one problem per name that is not registered, each naming
// the key handlers and listing the known names.
func (r *handlerRegistry) check(names []string) error {
	var ps []error
	for _, n := range names {
		if _, ok := r.ctors[n]; !ok {
			ps = append(ps, fmt.Errorf("handlers: unknown handler %q (known: %s)", n, strings.Join(r.names, ", ")))
		}
	}
	return errors.Join(ps...)
}

// build returns the handlers named, writing to tables in schema.
func (r *handlerRegistry) build(schema string, names []string) ([]sink.Handler, error) {
	if err := r.check(names); err != nil {
		return nil, err
	}
	hs := make([]sink.Handler, len(names))
	for i, n := range names {
		hs[i] = r.ctors[n](schema)
	}
	return hs, nil
}
