package processor

import (
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PartitionState is what one partition's worker is doing, as operators
// watch it: how far it got, how old the oldest record it holds unapplied
// is, and whether it is waiting to retry.
type PartitionState struct {
	Topic     string
	Partition int32
	// CommittedOffset is the offset of the next record the worker
	// applies: every record below it is committed to Postgres (its
	// effects or its dead letter). It stands still while the partition
	// is stalled (a batch blocked, retried, or nothing fetched) and moves
	// with every committed batch.
	CommittedOffset int64
	// Oldest is the timestamp of the partition's oldest record fetched
	// but not yet applied (the first, by offset, of the batch being
	// written, else of the records queued), zero when there is none:
	// the partition is caught up as far as its fetches go. Records not
	// fetched yet do not count (the offset lag does).
	Oldest time.Time
	// Retrying is true from a batch's first failure until records of it
	// commit: while it waits to be retried, while it is tried again, and
	// while the records of a batch that timed out are written again in
	// smaller batches (each of which may wait its transaction's timeout).
	// A partition whose batches commit is not retrying.
	Retrying bool
}

// TimeLag is now minus Oldest, 0 when Oldest is zero or in the future (a
// producer's clock ahead of this member's).
func (s PartitionState) TimeLag(now time.Time) time.Duration {
	if s.Oldest.IsZero() {
		return 0
	}
	return max(0, now.Sub(s.Oldest))
}

// Partitions returns the state of every partition assigned to this member
// now that has a worker (a partition fenced and waiting to be taken again,
// or paused with its stored offset out of range, has none), sorted by
// topic and partition. It is safe to call concurrently with Run.
func (c *Consumer) Partitions() []PartitionState {
	c.mu.Lock()
	ws := make([]*worker, 0, len(c.parts))
	for _, p := range c.parts {
		if p.w != nil {
			ws = append(ws, p.w)
		}
	}
	c.mu.Unlock()
	out := make([]PartitionState, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.state())
	}
	slices.SortFunc(out, func(a, b PartitionState) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	return out
}

// state reads w's state; safe to call from any goroutine.
func (w *worker) state() PartitionState {
	s := PartitionState{Topic: w.key.topic, Partition: w.key.partition, Retrying: w.retryingNow.Load()}
	// The queue's lock orders this read with take, which moves a batch
	// from the queue to inflight under it: a record is in one or the
	// other.
	w.mu.Lock()
	s.CommittedOffset = w.next.Load()
	var oldest *kgo.Record
	if r := w.inflight.Load(); r != nil && r.Offset >= s.CommittedOffset {
		oldest = r
	} else if len(w.queue) > 0 {
		oldest = w.queue[0]
	}
	w.mu.Unlock()
	if oldest != nil {
		s.Oldest = oldest.Timestamp
	}
	return s
}
