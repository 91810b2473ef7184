// A partition's worker: its state, its life (newWorker, run, loop), being
// told to stop, and being fenced by another writer.

package processor

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
)

// exit is why a worker's flush or life ended.
type exit int

const (
	committed exit = iota // the batch committed (flush and write only)
	smaller               // a transaction timed out: write the records again in a smaller batch (write only)
	stopped               // told to stop (revoke, shutdown) while not writing
	fenced                // another writer took the partition
	aborted               // its context was canceled (lost, abort, drain timeout)
)

// worker owns one assigned partition under one lease: it batches that
// partition's records and writes each batch in one transaction. The poll
// loop queues records to it without ever waiting (enqueue); the worker
// pauses the partition's fetching while its queue is full.
//
// Invariant: a worker writes batches in offset order, each starting where
// the previous committed one ended, and once a batch is given up without
// committing (stopped, fenced, aborted) the worker writes nothing more: it
// exits, and its queue is dropped. So the stored offset only ever advances
// over records whose effects or dead letters are in the same transaction.
// A new worker (a new lease, after a new assignment or a retake) starts
// again from the offset stored in Postgres — which can be behind the last
// committed batch by batches that wrote nothing and deferred their offset
// (those that closed within offsetEvery of the last store), when the worker
// ended in a crash or an abort (told to stop, it stores that offset as it
// exits): those are read again and found applied.
type worker struct {
	c       *Consumer
	key     tp
	epoch   int64         // the lease this worker writes under
	fence   int64         // the offset stored in Postgres as of the last commit (-1: none); worker goroutine only
	topicID uuid.NullUUID // the topic's Kafka id, stored with each batch's offset; not Valid when unknown

	next atomic.Int64 // records below it are written: dropped
	// stored: Postgres stores an offset for the partition — its lease
	// had one, or a batch of this worker stored one. Until then the
	// worker reads from Kafka's committed offset (or the log start).
	stored   atomic.Bool
	retrying bool // worker goroutine only
	// inflight is the first record of the batch being written, nil
	// between batches; retryingNow mirrors retrying. Both are read by
	// Partitions.
	inflight    atomic.Pointer[kgo.Record]
	retryingNow atomic.Bool
	// storedAt is when fence was stored (or the lease taken), and
	// wroteNothing whether the last batch, at its first attempt, found
	// every event applied: with more records queued, the next batch may
	// defer its offset (sink.Batch.DeferOffset) if offsetEvery has not
	// passed when it closes. Worker goroutine only.
	storedAt     time.Time
	wroteNothing bool
	// size is how many records, at most, a batch takes from those in
	// hand: BatchMaxRecords, halved after a transaction times out (down to
	// one), twice the records of a prefix the Writer committed when it
	// ran short of time isolating culprits, and doubled back (up to
	// BatchMaxRecords) after growAfter batches in a row committed whole;
	// whole counts those. Worker goroutine only.
	size  int
	whole int
	// dense: the last batch committed a prefix that was mostly dead
	// letters, so the next one isolates from the start
	// (sink.Batch.Isolate). Worker goroutine only.
	dense    bool
	deferred *kgo.Record  // the last record of the last batch that deferred its offset, while none has stored since
	events   []sink.Event // the last batch's events, cleared: reused by the next batch; worker goroutine only

	mu      sync.Mutex // guards the queue; the poll loop appends, the worker takes
	queue   []*kgo.Record
	qbytes  int
	firstAt time.Time // when the oldest queued record arrived
	paused  bool      // the partition's fetching is paused because the queue is full
	ending  bool      // write what is queued, then exit (endAfterQueue)

	wake chan struct{} // size 1: records were queued
	quit chan struct{} // closed to stop the worker
	// settle is closed half of DrainTimeout after quit (stopWorkers): an
	// isolation in flight then commits what it has settled (sink.Batch.Stop).
	settle chan struct{}
	done   chan struct{} // closed when the worker has exited

	ctx    context.Context // canceled to abort the in-flight transaction
	cancel context.CancelFunc
}

// newWorker starts the worker of partition k under lease l, consuming from
// next (-1: unknown, the first record fetched). Call with c.mu held.
func (c *Consumer) newWorker(k tp, l sink.Lease, next int64) *worker {
	ctx, cancel := context.WithCancel(c.hard)
	w := &worker{
		c: c, key: k, epoch: l.Epoch, fence: l.NextOffset, topicID: c.topicIDs[k.topic], storedAt: time.Now(),
		size: c.cfg.BatchMaxRecords,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), settle: make(chan struct{}), done: make(chan struct{}),
		ctx: ctx, cancel: cancel,
	}
	w.next.Store(max(next, 0))
	w.stored.Store(l.NextOffset >= 0)
	c.stats.workers.Add(1)
	go w.run()
	return w
}

func (w *worker) run() {
	defer close(w.done)
	defer w.cancel()
	defer w.c.stats.workers.Add(-1)
	switch w.loop() {
	case fenced:
		w.c.fenced(w)
	case stopped:
		w.mu.Lock()
		ending := w.ending
		w.mu.Unlock()
		if ending && !w.stopping() {
			w.c.endedAfterQueue(w)
		}
	}
}

// loop writes batches until the worker is stopped or gives a batch up.
func (w *worker) loop() exit {
	for {
		recs, ok := w.nextBatch()
		if !ok {
			w.storeDeferred()
			return stopped
		}
		if why := w.flush(recs); why != committed {
			if why == stopped { // told to stop while waiting to retry
				w.storeDeferred()
			}
			return why
		}
	}
}

// stopping reports whether the worker is told to stop.
func (w *worker) stopping() bool {
	select {
	case <-w.quit:
		return true
	default:
		return false
	}
}

func (w *worker) setRetrying(on bool) {
	if w.retrying == on {
		return
	}
	w.retrying = on
	w.retryingNow.Store(on)
	if on {
		w.c.stats.retrying.Add(1)
	} else {
		w.c.stats.retrying.Add(-1)
	}
}

// sleep waits d, or returns false early when the worker is told to stop or
// aborted: a batch waiting to be retried is then given up, never written.
func (w *worker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.ctx.Done():
	case <-w.quit:
	}
	return false
}

// fenced is called by a worker that stopped because another writer took
// its partition. The partition stays paused, with no worker, and is taken
// again after the session timeout if this member still owns it then: a
// zombie that took it late learns from the group by then that it lost it.
func (c *Consumer) fenced(w *worker) { c.detach(w, time.Now().Add(c.cfg.SessionTimeout)) }

// detach leaves w's partition paused with no worker, to be taken again at
// retakeAt (zero: never, until its offsets are reset), if w is still its
// worker.
func (c *Consumer) detach(w *worker, retakeAt time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	part := c.parts[w.key]
	if part == nil || part.w != w {
		return
	}
	part.w, part.retakeAt = nil, retakeAt
	c.cl.PauseFetchPartitions(map[string][]int32{w.key.topic: {w.key.partition}})
}
