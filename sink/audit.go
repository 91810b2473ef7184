package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Processed is one processed_events row.
type Processed struct {
	Handler     string    `json:"handler"`
	Bus         string    `json:"bus"`
	ProcessedAt time.Time `json:"processed_at"`
	TraceID     string    `json:"trace_id,omitempty"`
	// PayloadDigest is the hex digest of the payload the handler applied;
	// empty for rows written before digests were stored.
	PayloadDigest string `json:"payload_digest,omitempty"`
	// ReplayedBy is the sink_replays id of the backfill that applied this
	// row (a rewind for this handler, after which the handler applied an
	// event its siblings had applied before the rewind); 0 otherwise.
	ReplayedBy int64 `json:"replayed_by,omitempty"`
	// Slice is the dedup slice the row is in (see dedup.Retention).
	Slice int32 `json:"slice"`
	// RetainedUntil is when the row may be dropped at the earliest, past
	// the dedup horizon: the end of its slice plus the horizon (for the
	// current slice, whose end is not known, now plus the horizon). A
	// redelivery of the event before then is always skipped. Absent when
	// the horizon is unlimited. It is computed with the auditing process's
	// horizon: members maintaining the table with a shorter
	// dedup.retention drop it sooner.
	RetainedUntil *time.Time `json:"retained_until,omitempty"`
}

// DeadLetterRow is one dead_letters row, as audited.
type DeadLetterRow struct {
	Group     string `json:"consumer_group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// TopicID is the Kafka id of the topic the record was read from; nil
	// when unknown (brokers without topic ids, or a row written before
	// onceflow stored them). Two dead letters at one topic, partition and
	// offset with different ids are two records: the topic was deleted and
	// created again under its name in between.
	TopicID   *uuid.UUID `json:"topic_id,omitempty"`
	Reason    string     `json:"reason"`
	CreatedAt time.Time  `json:"created_at"`
	// Conflict is true when the reason is ReasonConflict: this delivery
	// reused the event id with another payload and applied nothing.
	Conflict bool `json:"conflict,omitempty"`
	// SchemaID is the schema id in the record's value when the value is
	// framed for a schema registry (Confluent's wire format: a zero byte,
	// then the id in 4 bytes, as Avro, Protobuf and JSON Schema
	// serializers write it): the writer schema to look up when the
	// registry did not know it or the body did not match it. 0 when the
	// value is not framed (or was not kept). With decode.format bytes, a
	// value that happens to begin so reads as framed too.
	SchemaID int `json:"schema_id,omitempty"`
	// Subject is the subject of SchemaID as the registry named it when
	// the record was decoded (a registry that keeps one schema under
	// several subjects names one of them), read from the reason; empty
	// when the reason names none (the registry did not know the id, or the
	// dead letter is a handler's).
	Subject string `json:"subject,omitempty"`
}

// framedSchemaID is the SQL of the schema id in a dead letter's stored
// value framed in the Confluent wire format, 0 for any other value.
const framedSchemaID = `CASE WHEN length(record_value) >= 5 AND get_byte(record_value, 0) = 0
  THEN (get_byte(record_value, 1)::int8 << 24) | (get_byte(record_value, 2)::int8 << 16)
        | (get_byte(record_value, 3)::int8 << 8) | get_byte(record_value, 4)::int8
  ELSE 0 END`

// subjectIn returns the subject a decode-time reason names for schema
// id: registry.DataError writes "schema id N (subject S): …".
func subjectIn(reason string, id int) string {
	rest, ok := strings.CutPrefix(reason, "schema id "+strconv.Itoa(id)+" (subject ")
	if !ok {
		return ""
	}
	subject, _, ok := strings.Cut(rest, "): ")
	if !ok {
		return ""
	}
	return subject
}

// EventAudit is what sink recorded about one event.
type EventAudit struct {
	EventID     uuid.UUID       `json:"event_id"`
	Processed   []Processed     `json:"processed"`
	DeadLetters []DeadLetterRow `json:"dead_letters"`
	// Conflict is true when some delivery of the event carried another
	// payload (a dead letter with ReasonConflict): the first version's
	// effects stand.
	Conflict bool `json:"conflict"`
}

// Audit reads the processed_events and dead_letters rows of one event in
// schema, processed rows in handler order. horizon is the dedup retention
// (0: unlimited), which RetainedUntil is computed from.
func Audit(ctx context.Context, pool *pgxpool.Pool, schema string, id uuid.UUID, horizon time.Duration) (EventAudit, error) {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	a := EventAudit{EventID: id, Processed: []Processed{}, DeadLetters: []DeadLetterRow{}}
	rows, err := pool.Query(ctx, `SELECT p.handler, p.bus, p.processed_at, coalesce(p.trace_id, ''),
  coalesce(encode(p.payload_digest, 'hex'), ''),
  coalesce((SELECT r.id FROM `+t("sink_replays")+` r
    WHERE r.handler = p.handler AND r.created_at <= p.processed_at
      AND EXISTS (SELECT 1 FROM `+t("processed_events")+` s
                  WHERE s.event_id = p.event_id AND s.handler <> p.handler AND s.processed_at < r.created_at)
    ORDER BY r.created_at DESC LIMIT 1), 0),
  p.slice,
  CASE WHEN $2::bigint > 0 THEN coalesce(
    (SELECT n.started_at FROM `+t("processed_events_slices")+` n WHERE n.slice > p.slice ORDER BY n.slice LIMIT 1),
    clock_timestamp()) + make_interval(secs => $2::bigint / 1e6) END
FROM `+t("processed_events")+` p WHERE p.event_id = $1 ORDER BY p.processed_at, p.handler`, id, horizon.Microseconds())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return a, fmt.Errorf("schema %q has no processed_events table: onceflow has not run there (check postgres.schema, --schema)", schema)
	}
	if err != nil {
		return a, fmt.Errorf("audit processed_events: %w", err)
	}
	a.Processed, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Processed])
	if err != nil {
		return a, fmt.Errorf("audit processed_events: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT consumer_group, topic, partition, "offset", topic_id, reason, created_at, reason = $2,
  `+framedSchemaID+`, ''
FROM `+t("dead_letters")+` WHERE event_id = $1 ORDER BY created_at`, id, ReasonConflict)
	if err != nil {
		return a, fmt.Errorf("audit dead_letters: %w", err)
	}
	a.DeadLetters, err = pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetterRow])
	if err != nil {
		return a, fmt.Errorf("audit dead_letters: %w", err)
	}
	for i, d := range a.DeadLetters {
		a.Conflict = a.Conflict || d.Conflict
		if d.SchemaID != 0 {
			a.DeadLetters[i].Subject = subjectIn(d.Reason, d.SchemaID)
		}
	}
	return a, nil
}
