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
	"github.com/onceflow/onceflow/sink"
)

// countChunk is how many records Count looks up in processed_events at
// once; it bounds Count's memory besides the keys of the range it has seen.
const countChunk = 5000

// Count reads the records each partition of plan would replay
// ([Partition.Target, Partition.Until)), decodes
// them with Config.Decode, and fills the partition's counts per handler
// from processed_events and dead_letters, in the order the sink decides:
// conflicts (a row with another payload digest: the event is refused for
// every handler), skipped (a row, or an earlier record of the range with
// the same id), then, of the event's pairs left, refused (Config.Parse
// refuses the event), dead-lettered before (the event has a dead letter at
// its offset from an earlier read), or applied. A record the decoder
// refuses counts as Undecodable and for no handler. What cannot be known
// without running the handlers is whether a handler refuses an event it
// accepted before, or accepts one it refused: Applied and
// DeadLetteredBefore assume neither. Count writes nothing; the group may
// be running, in which case the counts are those of the moment they are
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
		if p.Replays() {
			ranges[p.TopicPartition] = [2]int64{p.Target, p.Until}
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
		chunk = append(chunk, pendingRecord{TopicPartition{rec.Topic, rec.Partition}, ev.ID, dedup.PayloadDigest(ev.Value), ev})
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
	ev     sink.Event // for Config.Parse
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
	before, err := r.deadLettered(ctx, ids)
	if err != nil {
		return err
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
		var claims []string // the handlers that would claim the event
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
				claims = append(claims, h)
			}
		}
		if len(claims) == 0 {
			continue
		}
		refused, err := r.refuses(c.ev)
		if err != nil {
			return err
		}
		again := !refused && before[deadLetterAt{c.tp, c.ev.Offset, c.id}]
		switch {
		case refused:
			p.Refused++
		case again:
			p.DeadLetteredBefore++
		}
		for _, h := range claims {
			switch {
			case refused:
				p.Handlers[h].Refused++
			case again:
				p.Handlers[h].DeadLetteredBefore++
			default:
				p.Handlers[h].Applied++
				seen[dedup.Key{EventID: c.id, Handler: h}] = c.digest
			}
		}
	}
	return nil
}

// deadLetterAt is where a dead letter is, with its event id.
type deadLetterAt struct {
	tp     TopicPartition
	offset int64
	id     uuid.UUID
}

// deadLettered returns the dead letters of the group with one of ids that
// are not conflicts (a conflict is counted from processed_events).
func (r *Replayer) deadLettered(ctx context.Context, ids []pgtype.UUID) (map[deadLetterAt]bool, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	rows, err := r.cfg.Pool.Query(cctx, `SELECT topic, partition, "offset", event_id FROM `+r.table("dead_letters")+`
WHERE consumer_group = $1 AND event_id = ANY($2::uuid[]) AND reason <> $3`, r.cfg.Group, ids, sink.ReasonConflict)
	if err != nil {
		return nil, fmt.Errorf("replay: read dead_letters: %w", err)
	}
	out := map[deadLetterAt]bool{}
	var at deadLetterAt
	var id [16]byte
	_, err = pgx.ForEachRow(rows, []any{&at.tp.Topic, &at.tp.Partition, &at.offset, &id}, func() error {
		at.id = id
		out[at] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("replay: read dead_letters: %w", err)
	}
	return out, nil
}

// refuses reports whether Config.Parse refuses ev (false without a Parse).
// A panic in Parse is an error: the sink would retry the batch, not
// dead-letter the event.
func (r *Replayer) refuses(ev sink.Event) (refused bool, err error) {
	if r.cfg.Parse == nil {
		return false, nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("replay: parse %s/%d@%d: panic: %v", ev.Topic, ev.Partition, ev.Offset, p)
		}
	}()
	_, perr := r.cfg.Parse(ev)
	return perr != nil, nil
}

// consumes reports whether handler h takes records of topic.
func (r *Replayer) consumes(h, topic string) bool {
	ts, ok := r.cfg.HandlerTopics[h]
	return !ok || slices.Contains(ts, topic)
}
