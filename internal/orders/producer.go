package orders

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Same reports whether two order payloads are the same order, whatever
// their formatting or extra fields: the test that a repeated
// Idempotency-Key carries the request it was first used with. A payload
// that is not an order is only the same as identical bytes.
func Same(a, b []byte) bool {
	oa, errA := Parse(a)
	ob, errB := Parse(b)
	if errA != nil || errB != nil {
		return errA != nil && errB != nil && string(a) == string(b)
	}
	return oa.UserID == ob.UserID && slices.Equal(oa.Items, ob.Items)
}

// Querier is what Insert and ID need: a pgx.Tx, a *pgx.Conn or a
// *pgxpool.Pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Insert writes the order row of event id in schema and returns the
// order's id. It is the producer side's business write, made in the
// transaction that enqueues the event (outbox.Store.Enqueue).
func Insert(ctx context.Context, q Querier, schema string, id uuid.UUID, o Order) (int64, error) {
	var orderID int64
	err := q.QueryRow(ctx, `INSERT INTO `+pgx.Identifier{schema, "orders"}.Sanitize()+
		` (event_id, user_id, items) VALUES ($1, $2, $3) RETURNING id`, id, o.UserID, o.Items).Scan(&orderID)
	if err != nil {
		return 0, fmt.Errorf("insert order: %w", err)
	}
	return orderID, nil
}

// ErrNoOrder is returned by ID for an event with no order row.
var ErrNoOrder = errors.New("no order for this event")

// ID returns the id of the order row of event id in schema.
func ID(ctx context.Context, q Querier, schema string, id uuid.UUID) (int64, error) {
	var orderID int64
	err := q.QueryRow(ctx, `SELECT id FROM `+pgx.Identifier{schema, "orders"}.Sanitize()+` WHERE event_id = $1`, id).Scan(&orderID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, ErrNoOrder
	case err != nil:
		return 0, fmt.Errorf("read order of event %s: %w", id, err)
	}
	return orderID, nil
}
