package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/sink"
)

// handlerRegistry is every Go handler this program can run, by name: the
// handlers key chooses among them. A program embedding onceflow with its
// own handlers registers them the same way.
type handlerRegistry struct {
	names []string // in registration order: the default of the handlers key
	ctors map[string]func(schema string) sink.Handler
}

func (r *handlerRegistry) add(name string, ctor func(schema string) sink.Handler) {
	if r.ctors == nil {
		r.ctors = map[string]func(string) sink.Handler{}
	}
	r.names = append(r.names, name)
	r.ctors[name] = ctor
}

// registry has the demo business's four handlers.
var registry = func() *handlerRegistry {
	r := &handlerRegistry{}
	for _, name := range orders.Names {
		r.add(name, func(schema string) sink.Handler { h, _ := orders.New(name, schema); return h })
	}
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
