package replay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/dedup"
)

// Rewind performs plan: it checks that the group is stopped and that the
// plan stays within the dedup horizon (unless req forces it), then, for
// every partition that moves, in one Postgres transaction stores the
// target in sink_offsets with a new epoch and the topic's id today, and
// records a sink_replays row for each partition whose records the group
// reads again (Partition.Replays), and clears the offsets of the plan's
// Gone partitions, and then commits the targets to Kafka for the group. A partition whose
// stored offset is no longer the plan's Current (the group consumed since
// the plan) makes the whole rewind fail with nothing changed.
//
// Postgres is written first because members resume from it: if the Kafka
// commit then fails, the rewind has still happened for every member (the
// error says so; Kafka's offsets then follow at the group's first commits). The new epoch fences any member that took a partition before the
// transaction, so none can store an offset over the rewind.
func (r *Replayer) Rewind(ctx context.Context, plan *Plan, req Request) error {
	if err := plan.CheckHorizon(req); err != nil {
		return err
	}
	if err := r.CheckStopped(ctx); err != nil {
		return err
	}
	moves := slices.DeleteFunc(slices.Clone(plan.Partitions), func(p Partition) bool { return !p.Moves() })
	if len(moves) == 0 && len(plan.Gone) == 0 {
		return nil
	}
	replays := slices.DeleteFunc(slices.Clone(moves), func(p Partition) bool { return !p.Replays() })
	forced := req.RiskReapplyingEffects && plan.checkHorizon(time.Now(), false) != nil
	var handler *string
	if plan.Backfill != "" {
		handler = &plan.Backfill
	}
	n := len(moves)
	topics, parts, targets, ids := make([]string, n), make([]int32, n), make([]int64, n), make([]pgtype.UUID, n)
	for i, p := range moves {
		topics[i], parts[i], targets[i] = p.Topic, p.Partition, p.Target
		ids[i] = pgtype.UUID{Bytes: p.TopicID.UUID, Valid: p.TopicID.Valid}
	}
	n = len(replays)
	rTopics, rParts, rTargets, rFroms := make([]string, n), make([]int32, n), make([]int64, n), make([]int64, n)
	for i, p := range replays {
		rTopics[i], rParts[i], rTargets[i], rFroms[i] = p.Topic, p.Partition, p.Target, p.Until
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	err := pgx.BeginFunc(pctx, r.cfg.Pool, func(tx pgx.Tx) error {
		// Under the retention lock, no slice is dropped between reading
		// what is kept and recording the rewind; once recorded, drops
		// wait until the group has caught up (sink.ReplayInProgress).
		if err := dedup.LockRetention(pctx, tx, r.cfg.Schema); err != nil {
			return err
		}
		now := *plan
		kept, err := r.keptSince(pctx, tx)
		if err != nil {
			return err
		}
		now.KeptSince = kept
		if err := now.CheckHorizon(req); err != nil {
			return err
		}
		if err := r.checkUnmoved(pctx, tx, moves); err != nil {
			return err
		}
		if _, err := tx.Exec(pctx, `INSERT INTO `+r.table("sink_offsets")+` AS o (consumer_group, topic, partition, next_offset, epoch, topic_id)
SELECT $1, m.topic, m.partition, m.target, 1, m.topic_id FROM unnest($2::text[], $3::int[], $4::bigint[], $5::uuid[]) AS m(topic, partition, target, topic_id)
ORDER BY m.topic, m.partition
ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, epoch = o.epoch + 1,
  topic_id = coalesce(excluded.topic_id, o.topic_id), updated_at = now()`,
			r.cfg.Group, topics, parts, targets, ids); err != nil {
			return fmt.Errorf("store the targets in sink_offsets: %w", err)
		}
		if len(plan.Gone) > 0 {
			gTopics, gParts := make([]string, len(plan.Gone)), make([]int32, len(plan.Gone))
			for i, g := range plan.Gone {
				gTopics[i], gParts[i] = g.Topic, g.Partition
			}
			if _, err := tx.Exec(pctx, `UPDATE `+r.table("sink_offsets")+` o SET next_offset = NULL, topic_id = NULL, epoch = o.epoch + 1, updated_at = now()
FROM unnest($2::text[], $3::int[]) AS g(topic, partition)
WHERE o.consumer_group = $1 AND o.topic = g.topic AND o.partition = g.partition`, r.cfg.Group, gTopics, gParts); err != nil {
				return fmt.Errorf("clear the offsets of partitions the topics no longer have: %w", err)
			}
		}
		if _, err := tx.Exec(pctx, `INSERT INTO `+r.table("sink_replays")+` (consumer_group, topic, partition, from_offset, to_offset, handler, forced)
SELECT $1, m.topic, m.partition, m.from_offset, m.target, $5, $6 FROM unnest($2::text[], $3::int[], $4::bigint[], $7::bigint[]) AS m(topic, partition, target, from_offset)`,
			r.cfg.Group, rTopics, rParts, rTargets, handler, forced, rFroms); err != nil {
			return fmt.Errorf("record the rewind in sink_replays: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay: rewind group %s in Postgres (nothing changed): %w", r.cfg.Group, err)
	}
	if len(moves) == 0 {
		r.cfg.Logger.Info("replay: offsets of partitions the topics no longer have cleared", "group", r.cfg.Group, "partitions", len(plan.Gone))
		return nil
	}
	offsets := kadm.Offsets{}
	for _, p := range moves {
		offsets.Add(kadm.Offset{Topic: p.Topic, Partition: p.Partition, At: p.Target, LeaderEpoch: -1})
	}
	kctx, kcancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer kcancel()
	resp, err := r.adm.CommitOffsets(kctx, r.cfg.Group, offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("replay: group %s is rewound in Postgres, where members resume, so the replay will happen; "+
			"its Kafka committed offsets are not rewound (%w) and follow once the group commits again", r.cfg.Group, err)
	}
	r.cfg.Logger.Info("replay: group rewound", "group", r.cfg.Group, "partitions", len(moves), "backfill", plan.Backfill, "forced", forced)
	return nil
}

// checkUnmoved locks the sink_offsets rows of moves and returns an error if
// one holds an offset other than the plan's Current: the group consumed
// since the plan, whose counts and targets are then stale.
func (r *Replayer) checkUnmoved(ctx context.Context, tx pgx.Tx, moves []Partition) error {
	topics, parts := make([]string, len(moves)), make([]int32, len(moves))
	planned := map[TopicPartition]int64{}
	for i, p := range moves {
		topics[i], parts[i] = p.Topic, p.Partition
		planned[p.TopicPartition] = p.Current
	}
	rows, err := tx.Query(ctx, `SELECT o.topic, o.partition, o.next_offset FROM `+r.table("sink_offsets")+` o
JOIN unnest($2::text[], $3::int[]) AS m(topic, partition) ON o.topic = m.topic AND o.partition = m.partition
WHERE o.consumer_group = $1 AND o.next_offset IS NOT NULL
ORDER BY o.topic, o.partition FOR UPDATE OF o`, r.cfg.Group, topics, parts)
	if err != nil {
		return fmt.Errorf("lock sink_offsets: %w", err)
	}
	var tp TopicPartition
	var next int64
	var moved error
	_, err = pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition, &next}, func() error {
		if cur := planned[tp]; next != cur && moved == nil {
			moved = fmt.Errorf("%s is at offset %d, not %d as planned: the group consumed since the plan; plan again", tp, next, cur)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lock sink_offsets: %w", err)
	}
	return moved
}
