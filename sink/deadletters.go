// Dead letters: the rows a batch's transaction inserts (insertDeadLetters),
// their log lines, and the lease and marking of the rows the processor
// publishes to the dead-letter topic.

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

// ReleaseDeadLetters ends the lease of the rows ids that are not marked
// published: the next LeaseDeadLetters, of any publisher, may return them
// again. A publisher calls it for the copies the broker refused, so they
// are tried again after its backoff rather than when the lease runs out;
// never for a copy whose produce may still be under way.
func (w *Writer) ReleaseDeadLetters(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := w.pool.Exec(ctx, `UPDATE `+w.dead+` SET publish_after = NULL
WHERE id = ANY($1::bigint[]) AND published_at IS NULL`, ids)
	if err != nil {
		return fmt.Errorf("release dead letters: %w", err)
	}
	return nil
}

// OldestUnpublishedDeadLetter returns the age, by Postgres' clock, of the
// writer's group's oldest dead letter whose copy is not yet on the
// dead-letter topic, or 0 when every one is. It reads one row of an index;
// bound it with ctx. With no dead-letter topic configured nothing is ever
// published, so the age only grows: export it only when there is one.
func (w *Writer) OldestUnpublishedDeadLetter(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := w.pool.QueryRow(ctx, `SELECT coalesce((SELECT extract(epoch FROM clock_timestamp() - created_at) FROM `+w.dead+`
  WHERE consumer_group = $1 AND published_at IS NULL ORDER BY id LIMIT 1), 0)::float8`, w.cfg.Group).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("oldest unpublished dead letter: %w", err)
	}
	return time.Duration(max(secs, 0) * float64(time.Second)), nil
}

// logDeadLetters logs each dead letter a committed batch recorded: a
// record read again whose dead letter was recorded before is not logged
// again (nor counted, see Result.DeadLetters).
func (w *Writer) logDeadLetters(recorded []DeadLetter) {
	for _, d := range recorded {
		id := ""
		if d.EventID.Valid {
			id = d.EventID.UUID.String()
		}
		w.log.Warn("dead letter recorded", "topic", d.Topic, "partition", d.Partition, "offset", d.Offset,
			"event_id", id, "reason", d.Reason)
	}
}

// deadLetter is the dead letter of event i, which failed with err; it is
// logged.
func (w *Writer) deadLetter(b *Batch, i int, err error) DeadLetter {
	dl := newDeadLetter(b, i, err)
	w.logDeadLetter(dl)
	return dl
}

// newDeadLetter is the dead letter of event i of b, which failed with err.
func newDeadLetter(b *Batch, i int, err error) DeadLetter {
	e := b.Events[i]
	return sanitizeDeadLetter(DeadLetter{
		Topic: e.Topic, Partition: e.Partition, Offset: e.Offset,
		EventID: uuid.NullUUID{UUID: e.ID, Valid: true},
		Reason:  reason(err), Key: e.Key, Value: e.Value,
	})
}

// logDeadLetter logs, at debug, an event found to be a culprit: it is a
// dead letter only if its transaction commits, and it is logged at warn
// once its row is recorded (logDeadLetters, after COMMIT).
func (w *Writer) logDeadLetter(dl DeadLetter) {
	w.log.Debug("the event cannot be applied: a dead letter if the batch commits", "topic", dl.Topic, "partition", dl.Partition,
		"offset", dl.Offset, "event_id", dl.EventID.UUID.String(), "reason", dl.Reason)
}

// insertDeadLetters inserts dls, each sanitized (sanitizeDeadLetter),
// records of the topic whose Kafka id is topicID (not Valid: unknown), in
// tx, and returns those it inserted, sanitized. A record is named by its
// group, topic, partition, offset and topic id, NULL being an id of its
// own: a dead letter already there for the same record is not inserted
// again, and a row of another topic id (the topic deleted and recreated
// since) stands for another record.
func (w *Writer) insertDeadLetters(ctx context.Context, tx pgx.Tx, topicID uuid.NullUUID, dls []DeadLetter) ([]DeadLetter, error) {
	if len(dls) == 0 {
		return nil, nil
	}
	n := len(dls)
	topics, reasons := make([]string, n), make([]string, n)
	parts, offsets := make([]int32, n), make([]int64, n)
	ids := make([]pgtype.UUID, n) // binary encoding; uuid.NullUUID would be text
	keys, values := make([][]byte, n), make([][]byte, n)
	for i, d := range dls {
		d = sanitizeDeadLetter(d)
		topics[i], parts[i], offsets[i] = d.Topic, d.Partition, d.Offset
		ids[i] = pgtype.UUID{Bytes: d.EventID.UUID, Valid: d.EventID.Valid}
		reasons[i], keys[i], values[i] = d.Reason, d.Key, d.Value
	}
	rows, err := tx.Query(ctx, `INSERT INTO `+w.dead+`
(consumer_group, topic_id, topic, partition, "offset", event_id, reason, record_key, record_value)
SELECT $1, $9::uuid, d.* FROM unnest($2::text[], $3::int[], $4::bigint[], $5::uuid[], $6::text[], $7::bytea[], $8::bytea[])
  AS d(topic, partition, "offset", event_id, reason, record_key, record_value)
ON CONFLICT (consumer_group, topic, partition, "offset", topic_id) DO NOTHING
RETURNING topic, partition, "offset"`,
		w.cfg.Group, topics, parts, offsets, ids, reasons, keys, values, topicID)
	if err != nil {
		return nil, fmt.Errorf("insert dead letters: %w", err)
	}
	recorded, err := insertedDeadLetters(rows, dls)
	if err != nil {
		return nil, fmt.Errorf("insert dead letters: %w", err)
	}
	return recorded, nil
}
