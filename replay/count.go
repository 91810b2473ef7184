package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/processor"
)

// countChunk is how many records Count looks up in processed_events at
// once; it bounds Count's memory besides the keys of the range it has seen.
const countChunk = 5000

// Count reads the records each partition of plan would replay, decodes
// their ids with Config.Decode, and fills the partition's counts per
// handler from processed_events: applied (no row), skipped (a row, or an
// earlier record of the range with the same id) and conflicts (a row with
// another payload digest). A record the decoder refuses counts as
// Undecodable and for no handler. Count writes nothing; the group may be
// running, in which case the counts are those of the moment they are
// read.
func (r *Replayer) Count(ctx context.Context, plan *Plan) error {
	ranges := map[TopicPartition][2]int64{}
	index := map[TopicPartition]int{}
	for i := range plan.Partitions {
		p := &plan.Partitions[i]
		p.Counted, p.Records, p.Undecodable = true, 0, 0
		p.Handlers = map[string]*PairCounts{}
		for _, h := range r.cfg.Handlers {
			p.Handlers[h] = &PairCounts{}
		}
		index[p.TopicPartition] = i
		if p.Target < p.Current {
			ranges[p.TopicPartition] = [2]int64{p.Target, p.Current}
		}
	}
	seen := map[dedup.Key]dedup.Digest{} // keys the range applies, as it goes
	var chunk []pendingRecord
	flush := func() error {
		err := r.countChunk(ctx, plan, index, chunk, seen)
		chunk = chunk[:0]
		return err
	}
	err := r.read(ctx, ranges, func(rec *kgo.Record) error {
		p := &plan.Partitions[index[TopicPartition{rec.Topic, rec.Partition}]]
		p.Records++
		ev, err := processor.DecodeContext(ctx, rec, r.cfg.Decode)
		var de *processor.DecodeError
		if errors.As(err, &de) {
			p.Undecodable++
			return nil
		}
		if err != nil { // the schema registry's: the count would be wrong
			return err
		}
		chunk = append(chunk, pendingRecord{TopicPartition{rec.Topic, rec.Partition}, ev.ID, dedup.PayloadDigest(ev.Value)})
		if len(chunk) >= countChunk {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	return err
}

type pendingRecord struct {
	tp     TopicPartition
	id     uuid.UUID
	digest dedup.Digest
}

// countChunk counts the pairs of chunk, in record order, against the rows
// of processed_events and the keys seen earlier in the range.
func (r *Replayer) countChunk(ctx context.Context, plan *Plan, index map[TopicPartition]int, chunk []pendingRecord, seen map[dedup.Key]dedup.Digest) error {
	if len(chunk) == 0 {
		return nil
	}
	// pgtype.UUID, not [16]byte: under the exec and simple_protocol query
	// modes (a DSN behind a transaction pooler) parameters are sent as
	// text, and an array of [16]byte has no text encoding.
	ids := make([]pgtype.UUID, len(chunk))
	for i, c := range chunk {
		ids[i] = pgtype.UUID{Bytes: c.id, Valid: true}
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	rows, err := r.cfg.Pool.Query(cctx, `SELECT event_id, handler, payload_digest FROM `+r.table("processed_events")+`
WHERE event_id = ANY($1::uuid[]) AND handler = ANY($2)`, ids, r.cfg.Handlers)
	if err != nil {
		return fmt.Errorf("replay: read processed_events: %w", err)
	}
	stored := map[dedup.Key]dedup.Digest{}
	var id [16]byte
	var handler string
	var digest []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &handler, &digest}, func() error {
		var d dedup.Digest
		if len(digest) == len(d) {
			d = dedup.Digest(digest)
		}
		stored[dedup.Key{EventID: id, Handler: handler}] = d
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay: read processed_events: %w", err)
	}
	for _, c := range chunk {
		p := &plan.Partitions[index[c.tp]]
		// An event conflicts as a whole, as in the sink: if any handler
		// holds another digest, no handler applies it.
		conflict := false
		for _, h := range r.cfg.Handlers {
			if !r.consumes(h, c.tp.Topic) {
				continue
			}
			k := dedup.Key{EventID: c.id, Handler: h}
			if d, ok := stored[k]; ok && d.Conflicts(c.digest) {
				conflict = true
			} else if d, ok := seen[k]; ok && d.Conflicts(c.digest) {
				conflict = true
			}
		}
		for _, h := range r.cfg.Handlers {
			if !r.consumes(h, c.tp.Topic) {
				continue
			}
			k := dedup.Key{EventID: c.id, Handler: h}
			_, inTable := stored[k]
			_, inRange := seen[k]
			switch {
			case conflict:
				p.Handlers[h].Conflicts++
			case inTable || inRange:
				p.Handlers[h].Skipped++
			default:
				p.Handlers[h].Applied++
				seen[k] = c.digest
			}
		}
	}
	return nil
}

// consumes reports whether handler h takes records of topic.
func (r *Replayer) consumes(h, topic string) bool {
	ts, ok := r.cfg.HandlerTopics[h]
	return !ok || slices.Contains(ts, topic)
}
