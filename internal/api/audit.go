package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sink"
)

// EventAudit is what every step recorded about one event: the answer of
// GET /audit/event/{id} and of `onceflow audit`.
type EventAudit struct {
	sink.EventAudit // processed rows per handler, dead letters
	// EmailsSent counts the demo business's emails; absent where its
	// tables are not (a pipeline of other handlers).
	EmailsSent *int64 `json:"emails_sent,omitempty"`
	// Outbox is the event's outbox row: published, or failed with the
	// broker's reason; absent where there is no outbox (onceflow run alone).
	Outbox *outbox.Status `json:"outbox,omitempty"`
}

// ErrNotSeen is returned (wrapped, with the audit) by [Audit] for an event
// onceflow holds no record of: no outbox row, no processed_events row, no
// dead letter.
var ErrNotSeen = errors.New("no record of the event")

// Seen reports whether anything was recorded about the event: an outbox
// row, a processed_events row or a dead letter.
func (a EventAudit) Seen() bool {
	return len(a.Processed) > 0 || len(a.DeadLetters) > 0 || (a.Outbox != nil && a.Outbox.Count > 0)
}

// Audit gathers what sink, the demo business and the outbox recorded about
// event id in schema, listing processed rows in the order of handlers;
// horizon is the dedup retention (0: unlimited). A part whose tables do
// not exist in schema is left out. It reads only. For an event with no
// record at all ([EventAudit.Seen] false) it returns the (empty) audit
// and an error wrapping [ErrNotSeen] that says where it looked.
func Audit(ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, schema string, handlers []string, horizon time.Duration, id uuid.UUID) (EventAudit, error) {
	a, err := sink.Audit(ctx, pool, schema, id, horizon)
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
	out := EventAudit{EventAudit: a}
	emails, err := orders.EmailsSent(ctx, pool, schema, id)
	switch {
	case err == nil:
		out.EmailsSent = &emails
	case !missingTable(err):
		return EventAudit{}, err
	}
	st, err := store.Status(ctx, id)
	switch {
	case err == nil:
		out.Outbox = &st
	case !missingTable(err):
		return EventAudit{}, err
	}
	if !out.Seen() {
		return out, fmt.Errorf("%w %s in schema %s: no outbox row, no processed_events row, no dead letter "+
			"(a consumed record whose id could not be read has a dead letter without event_id: look it up by topic, partition and offset)",
			ErrNotSeen, id, schema)
	}
	return out, nil
}

// missingTable reports whether err is Postgres' undefined_table.
func missingTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
