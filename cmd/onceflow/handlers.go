package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/orders"
	pgmigrate "github.com/onceflow/onceflow/migrate"
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
	migrations []handlerMigration // the registered handlers' tables, in registration order
	parses     []handlerParse     // the registered handlers' shared parse, if any
}

func (r *handlerRegistry) add(name string, ctor func(schema string) sink.Handler) {
	if r.ctors == nil {
		r.ctors = map[string]func(string) sink.Handler{}
	}
	r.names = append(r.names, name)
	r.ctors[name] = ctor
}

// addMigration registers the migration of the tables of the handlers
// named: it runs when the configuration names any of them.
func (r *handlerRegistry) addMigration(m pgmigrate.Func, handlers ...string) {
	r.migrations = append(r.migrations, handlerMigration{m, handlers})
}

// addParse registers parse as the writer's sink.Config.Parse when the
// configuration names any of handlers: they read Event.Parsed.
func (r *handlerRegistry) addParse(parse func(sink.Event) (any, error), handlers ...string) {
	r.parses = append(r.parses, handlerParse{parse, handlers})
}

type handlerParse struct {
	f        func(sink.Event) (any, error)
	handlers []string
}

// parser returns the Parse of the registered handlers among names; nil
// when they have none. Handlers registered with a parse read Event.Parsed
// and parse for themselves when it is nil, so one writer can run a single
// registration's parse only: the first named.
func (r *handlerRegistry) parser(names []string) func(sink.Event) (any, error) {
	for _, p := range r.parses {
		if slices.ContainsFunc(p.handlers, func(h string) bool { return slices.Contains(names, h) }) {
			return p.f
		}
	}
	return nil
}

// handlerMigration is the migration of some registered handlers' tables.
type handlerMigration struct {
	f        pgmigrate.Func
	handlers []string
}

// migrator returns the migration of the tables of the handlers named, in
// schema: only what those handlers write to, so that a configuration
// without the demo's handlers gets none of the demo's tables.
func (r *handlerRegistry) migrator(names []string) pgmigrate.Func {
	return func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		for _, m := range r.migrations {
			if !slices.ContainsFunc(m.handlers, func(h string) bool { return slices.Contains(names, h) }) {
				continue
			}
			if err := m.f(ctx, pool, schema); err != nil {
				return err
			}
		}
		return nil
	}
}

// registry has the demo business's four handlers and their tables.
var registry = func() *handlerRegistry {
	r := &handlerRegistry{}
	for _, name := range orders.Names {
		r.add(name, func(schema string) sink.Handler { h, _ := orders.New(name, schema); return h })
	}
	r.addMigration(orders.Migrate, orders.Names...)
	r.addParse(orders.ParseEvent, orders.Names...)
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
