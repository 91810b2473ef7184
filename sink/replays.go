package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ReplayHold is how long, at least, a rewind not caught up holds the
// dropping of dedup slices (see ReplayInProgress): a week, or the horizon
// when it is longer. A group that never runs again pins the slices that
// long, and no longer.
const ReplayHold = 7 * 24 * time.Hour

// HoldForReplays is the dedup.Retention Hold of schema's processed_events
// for a horizon: ReplayInProgress within ReplayHold, or the horizon when
// it is longer.
func HoldForReplays(pool *pgxpool.Pool, schema string, horizon time.Duration) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		return ReplayInProgress(ctx, pool, schema, max(horizon, ReplayHold))
	}
}

// ReplayInProgress describes a rewind recorded in schema's sink_replays
// (by onceflow replay) in the last within that its group has not caught up
// with — a partition whose stored next offset is still below where the
// rewind started — or returns "" when there is none. dedup.Retention asks
// it before dropping slices (Retention.Hold): the replayed records are
// deduplicated against claims that must not be dropped before the group
// reads them again. A replay not caught up within `within` no longer
// holds anything.
func ReplayInProgress(ctx context.Context, pool *pgxpool.Pool, schema string, within time.Duration) (string, error) {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	var group, topic string
	var partition int32
	var next, from int64
	var at time.Time
	err := pool.QueryRow(ctx, `SELECT r.consumer_group, r.topic, r.partition, coalesce(o.next_offset, r.to_offset), r.from_offset, r.created_at
FROM `+t("sink_replays")+` r
JOIN `+t("sink_offsets")+` o ON o.consumer_group = r.consumer_group AND o.topic = r.topic AND o.partition = r.partition
WHERE r.from_offset IS NOT NULL AND r.created_at > now() - make_interval(secs => $1)
  AND coalesce(o.next_offset, r.to_offset) < r.from_offset
ORDER BY r.created_at DESC LIMIT 1`, within.Seconds()).Scan(&group, &topic, &partition, &next, &from, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read sink_replays: %w", err)
	}
	return fmt.Sprintf("the replay of group %s (%s) has not caught up: %s/%d is at offset %d of %d",
		group, at.UTC().Format(time.RFC3339), topic, partition, next, from), nil
}
