package outbox

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate creates or upgrades the outbox table in schema.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return migrate.Apply(ctx, pool, schema, "outbox", migrations, "migrations")
}

// ErrKeyReused is returned when an event id (an Idempotency-Key) comes back
// with a different payload than the first time.
var ErrKeyReused = errors.New("idempotency key already used with a different body")

// StoreConfig configures a Store. Zero values take the defaults noted.
type StoreConfig struct {
	Schema string // schema of the outbox table; default "public"
	Bus    string // the outbox.bus value of new rows; default "kafka"
	Topic  string // topic the relay publishes new rows to; required
	// SamePayload reports whether a repeated event id's payload is the one
	// it was first enqueued with (a retried request); default bytes.Equal.
	SamePayload func(stored, payload []byte) bool
	// Timeout bounds each call's Postgres work; default 5s.
	Timeout time.Duration
}

// Store writes events to the outbox. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	cfg    StoreConfig
	outbox string
}

// NewStore returns a Store over the outbox table of cfg.Schema, or an
// error naming every problem with cfg.
func NewStore(pool *pgxpool.Pool, cfg StoreConfig) (*Store, error) {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Bus == "" {
		cfg.Bus = "kafka"
	}
	if cfg.SamePayload == nil {
		cfg.SamePayload = bytes.Equal
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	var ps []error
	if pool == nil {
		ps = append(ps, errors.New("outbox: nil pool"))
	}
	if cfg.Topic == "" {
		ps = append(ps, errors.New("outbox: no topic"))
	}
	if cfg.Timeout < 0 {
		ps = append(ps, fmt.Errorf("outbox: timeout %v is negative", cfg.Timeout))
	}
	if err := errors.Join(ps...); err != nil {
		return nil, err
	}
	return &Store{pool: pool, cfg: cfg, outbox: pgx.Identifier{cfg.Schema, "outbox"}.Sanitize()}, nil
}

// Event is one event to publish.
type Event struct {
	ID      uuid.UUID // the event id: a client's Idempotency-Key
	Payload []byte    // the record value
	// Traceparent, if not empty, is the W3C trace context the relay
	// publishes the event with.
	Traceparent string
}

// Write is the business change an event announces, made in the
// transaction that enqueues it (the seed's order row, for example).
type Write func(ctx context.Context, tx pgx.Tx) error

// Enqueued is the answer to Enqueue.
type Enqueued struct {
	// Replayed is true when the event id was enqueued before: nothing new
	// was written and the write did not run.
	Replayed bool
}

// Enqueue inserts ev's outbox row and, in the same transaction, runs write
// (nil: none). An event id seen before writes nothing: Enqueue returns
// Replayed, or ErrKeyReused when SamePayload says the payload differs. A
// write's error rolls everything back and is returned as it is.
func (s *Store) Enqueue(ctx context.Context, ev Event, write Write) (Enqueued, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var tp *string
	if ev.Traceparent != "" {
		tp = &ev.Traceparent
	}
	var res Enqueued
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO `+s.outbox+` (event_id, bus, topic, payload, traceparent)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING RETURNING id`,
			ev.ID, s.cfg.Bus, s.cfg.Topic, ev.Payload, tp).Scan(&id)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			res.Replayed = true
			var stored []byte
			if err := tx.QueryRow(ctx, `SELECT payload FROM `+s.outbox+` WHERE event_id = $1`, ev.ID).Scan(&stored); err != nil {
				return fmt.Errorf("read the first request of key %s: %w", ev.ID, err)
			}
			if !s.cfg.SamePayload(stored, ev.Payload) {
				return ErrKeyReused
			}
			return nil
		case err != nil:
			return fmt.Errorf("insert outbox row: %w", err)
		case write != nil:
			return write(ctx, tx)
		}
		return nil
	})
	return res, err
}

// Status is an event's outbox state, as audited.
type Status struct {
	Count      int        `json:"count"`       // outbox rows with the event id: 0 or 1
	Published  bool       `json:"published"`   // the relay has published it
	Publishes  int        `json:"publishes"`   // times it was published (replays included)
	FailedAt   *time.Time `json:"failed_at"`   // set when the broker refused it
	FailReason string     `json:"fail_reason"` // the broker's reason
}

// Status reads an event's outbox row.
func (s *Store) Status(ctx context.Context, id uuid.UUID) (Status, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var st Status
	err := s.pool.QueryRow(ctx, `SELECT count(*), coalesce(bool_or(published_at IS NOT NULL), false), coalesce(sum(publishes), 0),
  max(failed_at), coalesce(max(fail_reason), '')
FROM `+s.outbox+` WHERE event_id = $1`, id).Scan(&st.Count, &st.Published, &st.Publishes, &st.FailedAt, &st.FailReason)
	if err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	return st, nil
}

// Payload returns the stored payload of an event, or pgx.ErrNoRows.
func (s *Store) Payload(ctx context.Context, id uuid.UUID) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var p []byte
	err := s.pool.QueryRow(ctx, `SELECT payload FROM `+s.outbox+` WHERE event_id = $1`, id).Scan(&p)
	return p, err
}

// MarkRepublished counts a manual re-publication of an event (a simulated
// broker redelivery).
func (s *Store) MarkRepublished(ctx context.Context, id uuid.UUID) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.outbox+` SET publishes = publishes + 1 WHERE event_id = $1`, id); err != nil {
		return fmt.Errorf("count the re-publication of %s: %w", id, err)
	}
	return nil
}
