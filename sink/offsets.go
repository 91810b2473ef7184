// The partition's fence in sink_offsets: Take leases partitions to a new
// owner (a new epoch each), and storeOffset is the compare-and-set on
// (epoch, offset) every batch's transaction ends with.

package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Lease is what a new owner of a partition gets from [Writer.Take].
type Lease struct {
	// Epoch is the owner's fencing token: every batch it writes carries
	// it, and a batch of any older epoch is fenced.
	Epoch int64
	// NextOffset is the offset stored for the partition, where
	// consumption must start; -1 when none is stored yet.
	NextOffset int64
	// TopicID is the Kafka topic id NextOffset was stored for (Batch.TopicID
	// of the last batch); not Valid when unknown. A different id now means
	// the topic was deleted and recreated: NextOffset is not an offset of
	// the log there is today.
	TopicID uuid.NullUUID
}

// Take makes the caller the writer of the given partitions of topic: in one
// statement it bumps each partition's epoch in sink_offsets (creating the
// row if needed) and returns the new epoch with the stored offset. From
// then on, batches of any earlier epoch are fenced, whether or not the new
// owner has written anything. Rows are taken in partition order, so
// concurrent takers do not deadlock.
func (w *Writer) Take(ctx context.Context, topic string, partitions []int32) (map[int32]Lease, error) {
	ps := slices.Clone(partitions)
	slices.Sort(ps)
	rows, err := w.pool.Query(ctx, `INSERT INTO `+w.offsets+` AS o (consumer_group, topic, partition, next_offset, epoch)
SELECT $1, $2, p, NULL, 1 FROM unnest($3::int[]) AS p ORDER BY p
ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET epoch = o.epoch + 1, updated_at = now()
RETURNING partition, epoch, coalesce(next_offset, -1), topic_id`, w.cfg.Group, topic, ps)
	if err != nil {
		return nil, fmt.Errorf("take partitions: %w", err)
	}
	out := make(map[int32]Lease, len(ps))
	var p int32
	var l Lease
	_, err = pgx.ForEachRow(rows, []any{&p, &l.Epoch, &l.NextOffset, &l.TopicID}, func() error { out[p] = l; return nil })
	if err != nil {
		return nil, fmt.Errorf("take partitions: %w", err)
	}
	return out, nil
}

// storeOffset is the fence: it moves sink_offsets from (b.Epoch, b.Fence)
// to next (b.NextOffset, or the end of the prefix committed). Zero rows
// updated means another writer took the partition, or an earlier attempt
// of b committed.
func (w *Writer) storeOffset(ctx context.Context, tx pgx.Tx, b *Batch, next int64) error {
	var fence *int64
	if b.Fence >= 0 {
		fence = &b.Fence
	}
	tag, err := tx.Exec(ctx, `UPDATE `+w.offsets+` SET next_offset = $4, topic_id = coalesce($7::uuid, topic_id), updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND epoch = $5 AND next_offset IS NOT DISTINCT FROM $6::bigint`,
		w.cfg.Group, b.Topic, b.Partition, next, b.Epoch, fence, b.TopicID)
	if err != nil {
		return fmt.Errorf("store offset: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	fe := &FencedError{Group: w.cfg.Group, Topic: b.Topic, Partition: b.Partition,
		Epoch: b.Epoch, Fence: b.Fence, Next: next, StoredEpoch: -1, StoredOffset: -1}
	err = tx.QueryRow(ctx, `SELECT epoch, coalesce(next_offset, -1) FROM `+w.offsets+`
WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, w.cfg.Group, b.Topic, b.Partition).Scan(&fe.StoredEpoch, &fe.StoredOffset)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("store offset: read the fence: %w", err)
	}
	return fe
}
