package sink

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// PendingDeadLetter is a dead_letters row whose copy is not yet on the
// dead-letter topic.
type PendingDeadLetter struct {
	ID int64 // the row's id
	DeadLetter
	// TopicID is the Kafka topic id of the record's topic (Batch.TopicID):
	// two dead letters at one topic, partition and offset are of a topic
	// deleted and recreated under the same name between them. Not Valid
	// when unknown.
	TopicID uuid.NullUUID
}

// LeaseDeadLetters returns up to limit dead letters of the writer's group
// that are not yet published, oldest first, and leases them for lease: no
// other caller gets them until the lease ends or they are marked
// published. Rows locked or leased by another publisher are skipped. The
// statement holds no lock once it returns, so producing them never holds a
// transaction open.
func (w *Writer) LeaseDeadLetters(ctx context.Context, limit int, lease time.Duration) ([]PendingDeadLetter, error) {
	rows, err := w.pool.Query(ctx, `UPDATE `+w.dead+` AS d SET publish_after = now() + $3 * interval '1 millisecond'
WHERE d.id IN (
  SELECT id FROM `+w.dead+`
  WHERE consumer_group = $1 AND published_at IS NULL AND (publish_after IS NULL OR publish_after < now())
  ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING d.id, d.topic, d.partition, d."offset", d.event_id, d.reason, d.record_key, d.record_value, d.topic_id`,
		w.cfg.Group, limit, lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("lease dead letters: %w", err)
	}
	var out []PendingDeadLetter
	var p PendingDeadLetter
	var id, topicID pgtype.UUID
	_, err = pgx.ForEachRow(rows, []any{&p.ID, &p.Topic, &p.Partition, &p.Offset, &id, &p.Reason, &p.Key, &p.Value, &topicID}, func() error {
		p.EventID = uuid.NullUUID{UUID: id.Bytes, Valid: id.Valid}
		p.TopicID = uuid.NullUUID{UUID: topicID.Bytes, Valid: topicID.Valid}
		out = append(out, p)
		p = PendingDeadLetter{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lease dead letters: %w", err)
	}
	slices.SortFunc(out, func(a, b PendingDeadLetter) int { return int(a.ID - b.ID) })
	return out, nil
}

// MarkDeadLettersPublished records that the rows ids are on the dead-letter
// topic; notes[i] (may be empty) says how row ids[i] was published, e.g.
// without its value.
func (w *Writer) MarkDeadLettersPublished(ctx context.Context, ids []int64, notes []string) error {
	if len(ids) == 0 {
		return nil
	}
	if len(notes) != len(ids) {
		return fmt.Errorf("mark dead letters published: %d ids, %d notes", len(ids), len(notes))
	}
	_, err := w.pool.Exec(ctx, `UPDATE `+w.dead+` AS d SET published_at = now(), publish_note = nullif(n.note, '')
FROM unnest($1::bigint[], $2::text[]) AS n(id, note) WHERE d.id = n.id`, ids, notes)
	if err != nil {
		return fmt.Errorf("mark dead letters published: %w", err)
	}
	return nil
}
