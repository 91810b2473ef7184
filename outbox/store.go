package outbox

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/orders"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate creates the orders and outbox tables in schema.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return migrate.Apply(ctx, pool, schema, "outbox", migrations, "migrations")
}

// ErrKeyReused is returned when an Idempotency-Key comes back with a
// different body than the first time.
var ErrKeyReused = errors.New("idempotency key already used with a different body")

// Store writes orders and their outbox rows. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	topic  string
	bus    string
	orders string
	outbox string
}

// NewStore returns a Store over the tables in schema, whose events go to
// topic on bus.
func NewStore(pool *pgxpool.Pool, schema, bus, topic string) *Store {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return &Store{pool: pool, topic: topic, bus: bus, orders: t("orders"), outbox: t("outbox")}
}

// Accepted is the answer to an enqueued order; the same for every request
// with one key.
type Accepted struct {
	EventID uuid.UUID `json:"event_id"`
	OrderID int64     `json:"order_id"`
	Status  string    `json:"status"` // "accepted"
	// Replayed is true when this key had already been accepted: nothing
	// new was written. (Also sent as the Idempotent-Replayed header.)
	Replayed bool `json:"-"`
}

// Enqueue inserts the order and its outbox row in one transaction, with key
// as the event id. A key seen before writes nothing and returns the first
// answer (Replayed set), or ErrKeyReused if payload differs. payload must
// be a valid order (orders.Parse). traceparent, if not empty, is the W3C
// trace context the relay publishes with the event.
func (s *Store) Enqueue(ctx context.Context, key uuid.UUID, payload []byte, traceparent string) (Accepted, error) {
	o, err := orders.Parse(payload)
	if err != nil {
		return Accepted{}, err
	}
	var tp *string
	if traceparent != "" {
		tp = &traceparent
	}
	a := Accepted{EventID: key, Status: "accepted"}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO `+s.orders+` (event_id, user_id, items) VALUES ($1, $2, $3)
ON CONFLICT (event_id) DO NOTHING RETURNING id`, key, o.UserID, o.Items).Scan(&a.OrderID)
		if errors.Is(err, pgx.ErrNoRows) {
			a.Replayed = true
			var stored []byte
			if err := tx.QueryRow(ctx, `SELECT o.id, x.payload FROM `+s.orders+` o JOIN `+s.outbox+` x USING (event_id)
WHERE o.event_id = $1`, key).Scan(&a.OrderID, &stored); err != nil {
				return fmt.Errorf("read the first request of key %s: %w", key, err)
			}
			if !bytes.Equal(canonical(stored), canonical(payload)) {
				return ErrKeyReused
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+s.outbox+` (event_id, bus, topic, payload, traceparent)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING`, key, s.bus, s.topic, payload, tp)
		if err != nil {
			return fmt.Errorf("insert outbox row: %w", err)
		}
		return nil
	})
	return a, err
}

// canonical re-encodes an order so that formatting differences do not
// count as a different body.
func canonical(payload []byte) []byte {
	o, err := orders.Parse(payload)
	if err != nil {
		return payload
	}
	return []byte(fmt.Sprintf("%d|%q", o.UserID, o.Items))
}

// Status is an event's outbox state.
type Status struct {
	Count     int  `json:"count"`     // outbox rows with the event id: 0 or 1
	Published bool `json:"published"` // the relay has published it
	Publishes int  `json:"publishes"` // times it was published (replays included)
}

// Status reads an event's outbox row.
func (s *Store) Status(ctx context.Context, id uuid.UUID) (Status, error) {
	var st Status
	err := s.pool.QueryRow(ctx, `SELECT count(*), coalesce(bool_or(published_at IS NOT NULL), false), coalesce(sum(publishes), 0)
FROM `+s.outbox+` WHERE event_id = $1`, id).Scan(&st.Count, &st.Published, &st.Publishes)
	if err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	return st, nil
}

// Payload returns the stored payload of an event, or pgx.ErrNoRows.
func (s *Store) Payload(ctx context.Context, id uuid.UUID) ([]byte, error) {
	var p []byte
	err := s.pool.QueryRow(ctx, `SELECT payload FROM `+s.outbox+` WHERE event_id = $1`, id).Scan(&p)
	return p, err
}

// MarkRepublished counts a manual re-publication of an event (a simulated
// broker redelivery).
func (s *Store) MarkRepublished(ctx context.Context, id uuid.UUID) error {
	_, err := s.pool.Exec(ctx, `UPDATE `+s.outbox+` SET publishes = publishes + 1 WHERE event_id = $1`, id)
	return err
}
