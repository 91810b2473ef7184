package api

import (
	"cmp"
	"context"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sink"
)

// EventAudit is what every step recorded about one event: the answer of
// GET /audit/event/{id} and of `onceflow audit`.
type EventAudit struct {
	sink.EventAudit               // processed rows per handler, dead letters
	EmailsSent      int64         `json:"emails_sent"` // the demo business's emails
	Outbox          outbox.Status `json:"outbox"`      // published, or failed with the broker's reason
}

// Audit gathers what sink, the demo business and the outbox recorded about
// event id in schema, listing processed rows in the order of handlers. It
// reads only.
func Audit(ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, schema string, handlers []string, id uuid.UUID) (EventAudit, error) {
	a, err := sink.Audit(ctx, pool, schema, id)
	if err != nil {
		return EventAudit{}, err
	}
	rank := func(h string) int {
		if i := slices.Index(handlers, h); i >= 0 {
			return i
		}
		return len(handlers)
	}
	slices.SortStableFunc(a.Processed, func(x, y sink.Processed) int { return cmp.Compare(rank(x.Handler), rank(y.Handler)) })
	emails, err := orders.EmailsSent(ctx, pool, schema, id)
	if err != nil {
		return EventAudit{}, err
	}
	st, err := store.Status(ctx, id)
	if err != nil {
		return EventAudit{}, err
	}
	return EventAudit{EventAudit: a, EmailsSent: emails, Outbox: st}, nil
}
