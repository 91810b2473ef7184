// A worker's queue: the poll loop appends a partition's records without
// waiting (enqueue), the partition is paused at the high water and resumed
// under half, and the worker takes a batch when one is due.

package processor

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// highWater is the queue size, in records and in bytes, at which the
// partition is paused; it is resumed when the queue is back under half.
func (w *worker) highWater() (int, int) {
	return max(2*w.c.cfg.BatchMaxRecords, minHighWater), 2 * w.c.cfg.BatchMaxBytes
}

// minHighWater keeps small batches (down to one record) from pausing and
// resuming the partition's fetching on every batch; the queue's bytes stay
// bounded by twice BatchMaxBytes whatever the record count.
const minHighWater = 256

// enqueue queues records fetched for the partition. It never blocks on the
// worker; it pauses the partition's fetching when the queue is full.
// Called by the poll loop.
func (w *worker) enqueue(recs []*kgo.Record) {
	maxRecs, maxBytes := w.highWater()
	next := w.next.Load()
	w.mu.Lock()
	for _, r := range recs {
		if r.Offset < next {
			continue // written already
		}
		if len(w.queue) == 0 {
			w.firstAt = time.Now()
		}
		w.queue = append(w.queue, r)
		w.qbytes += len(r.Value)
	}
	if !w.paused && (len(w.queue) >= maxRecs || w.qbytes >= maxBytes) {
		w.paused = true
		w.c.cl.PauseFetchPartitions(map[string][]int32{w.key.topic: {w.key.partition}})
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// nextBatch waits until a batch is due — BatchMaxRecords or BatchMaxBytes
// queued, or BatchLinger since the oldest queued record — and takes it
// from the queue. It reports false when the worker is told to stop, even
// with batches due: a stopping worker starts none (what is queued is the
// next owner's to read), so a revoke or a shutdown waits for the batch in
// flight only; and when an ending worker's queue is empty.
func (w *worker) nextBatch() ([]*kgo.Record, bool) {
	cfg := &w.c.cfg
	for {
		select {
		case <-w.quit:
			return nil, false
		default:
		}
		w.mu.Lock()
		n, size, first, ending := len(w.queue), w.qbytes, w.firstAt, w.ending
		w.mu.Unlock()
		if n == 0 && ending {
			return nil, false
		}
		wait := cfg.BatchLinger - time.Since(first)
		if n > 0 && (n >= cfg.BatchMaxRecords || size >= cfg.BatchMaxBytes || wait <= 0) {
			return w.take(), true
		}
		var linger <-chan time.Time
		var t *time.Timer
		if n > 0 {
			t = time.NewTimer(wait)
			linger = t.C
		}
		select {
		case <-w.quit:
			if t != nil {
				t.Stop()
			}
			return nil, false
		case <-w.wake:
		case <-linger:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// take removes one batch from the head of the queue, resuming the
// partition's fetching once the queue is back under half its high water
// (unless the worker is ending: see endAfterQueue).
func (w *worker) take() []*kgo.Record {
	cfg := &w.c.cfg
	maxRecs, maxBytes := w.highWater()
	w.mu.Lock()
	defer w.mu.Unlock()
	n, size := 0, 0
	for n < len(w.queue) && n < cfg.BatchMaxRecords && (n == 0 || size+len(w.queue[n].Value) <= cfg.BatchMaxBytes) {
		size += len(w.queue[n].Value)
		n++
	}
	batch := w.queue[:n:n]
	if n > 0 {
		w.inflight.Store(batch[0])
	}
	w.queue = w.queue[n:]
	w.qbytes -= size
	if len(w.queue) == 0 {
		w.queue = nil
	} else {
		w.firstAt = time.Now()
	}
	if w.paused && !w.ending && len(w.queue) < maxRecs/2 && w.qbytes < maxBytes/2 {
		w.paused = false
		w.c.cl.ResumeFetchPartitions(map[string][]int32{w.key.topic: {w.key.partition}})
	}
	return batch
}

// endAfterQueue has the worker write what is queued and then exit (its
// partition is then paused: Consumer.endedAfterQueue). Its fetching must
// be paused already: the worker no longer resumes it.
func (w *worker) endAfterQueue() {
	w.mu.Lock()
	w.ending = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// queueFull reports whether the worker has paused its partition's
// fetching because its queue is full.
func (w *worker) queueFull() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.paused
}
