package sink

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// HandlerFunc returns a [Handler] called name whose Apply is apply: the
// shortest way to write a handler. apply has Handler.Apply's contract — it
// receives only the events the handler newly claimed, writes in bulk
// inside tx, never commits or rolls back tx, and returns a *RejectError
// for an event it can never apply. The Handler is safe for concurrent use
// when apply is.
func HandlerFunc(name string, apply func(ctx context.Context, tx pgx.Tx, events []Event) error) Handler {
	return handlerFunc{name: name, apply: apply}
}

type handlerFunc struct {
	name  string
	apply func(context.Context, pgx.Tx, []Event) error
}

func (h handlerFunc) Name() string { return h.name }

func (h handlerFunc) Apply(ctx context.Context, tx pgx.Tx, events []Event) error {
	return h.apply(ctx, tx, events)
}
