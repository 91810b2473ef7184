package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Processed is one processed_events row.
type Processed struct {
	Handler     string    `json:"handler"`
	Bus         string    `json:"bus"`
	ProcessedAt time.Time `json:"processed_at"`
	TraceID     string    `json:"trace_id,omitempty"`
}

// DeadLetterRow is one dead_letters row, as audited.
type DeadLetterRow struct {
	Group     string    `json:"consumer_group"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
}

// EventAudit is what sink recorded about one event.
type EventAudit struct {
	EventID     uuid.UUID       `json:"event_id"`
	Processed   []Processed     `json:"processed"`
	DeadLetters []DeadLetterRow `json:"dead_letters"`
}

// Audit reads the processed_events and dead_letters rows of one event in
// schema, processed rows in handler order.
func Audit(ctx context.Context, pool *pgxpool.Pool, schema string, id uuid.UUID) (EventAudit, error) {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	a := EventAudit{EventID: id, Processed: []Processed{}, DeadLetters: []DeadLetterRow{}}
	rows, err := pool.Query(ctx, `SELECT handler, bus, processed_at, coalesce(trace_id, '')
FROM `+t("processed_events")+` WHERE event_id = $1 ORDER BY processed_at, handler`, id)
	if err != nil {
		return a, fmt.Errorf("audit processed_events: %w", err)
	}
	a.Processed, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Processed])
	if err != nil {
		return a, fmt.Errorf("audit processed_events: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT consumer_group, topic, partition, "offset", reason, created_at
FROM `+t("dead_letters")+` WHERE event_id = $1 ORDER BY created_at`, id)
	if err != nil {
		return a, fmt.Errorf("audit dead_letters: %w", err)
	}
	a.DeadLetters, err = pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetterRow])
	if err != nil {
		return a, fmt.Errorf("audit dead_letters: %w", err)
	}
	return a, nil
}
