// The events a Writer's open transactions are claiming: a batch that holds
// one of them waits for that transaction to end before it begins its own.

package sink

import (
	"context"
	"sync"

	"github.com/google/uuid"
)

// inflight records, for each event a Writer's open transactions claim,
// the transaction that claims it. A claim of an event another open
// transaction has claimed waits in Postgres for that transaction's end
// (its insert cannot tell a duplicate from an event still its own to
// apply before), and while it waits it holds the keys it claimed before:
// batches of other partitions that need one of them queue behind it. A
// batch of this Writer that would claim such an event waits here instead,
// holding nothing, and then finds the event in the cache if the other
// transaction committed it. Transactions of other Writers (other members)
// are not seen: their claims still wait in Postgres.
//
// A batch enters only when none of its events is held, and holds all of
// them until its transaction ends; a batch that waits holds nothing, so
// no two batches wait for each other.
type inflight struct {
	mu sync.Mutex
	at map[uuid.UUID]*holder
}

// holder is one transaction's hold on its events; done is closed when it
// leaves.
type holder struct {
	done chan struct{}
	ids  []uuid.UUID
}

// enter holds ids for a new transaction and returns its holder, or, if
// another transaction holds one of them, returns nil and that
// transaction's done channel.
func (f *inflight) enter(ids []uuid.UUID) (*holder, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == nil {
		f.at = make(map[uuid.UUID]*holder)
	}
	for _, id := range ids {
		if o, ok := f.at[id]; ok {
			return nil, o.done
		}
	}
	h := &holder{done: make(chan struct{}), ids: ids}
	for _, id := range ids {
		f.at[id] = h
	}
	return h, nil
}

// leave ends h's hold and wakes those waiting for it. A nil h is a no-op.
func (f *inflight) leave(h *holder) {
	if h == nil {
		return
	}
	f.mu.Lock()
	for _, id := range h.ids {
		if f.at[id] == h {
			delete(f.at, id)
		}
	}
	f.mu.Unlock()
	close(h.done)
}

// waitInflight waits, in a sink.wait_inflight span, until busy is closed
// or ctx is done, and returns ctx's error then.
func (w *Writer) waitInflight(ctx context.Context, busy <-chan struct{}) error {
	_, span := w.tracer.Start(ctx, "sink.wait_inflight")
	var err error
	select {
	case <-busy:
	case <-ctx.Done():
		err = ctx.Err()
	}
	endSpan(span, err)
	return err
}

// eventIDs returns the distinct event ids of keys, which list an event's
// keys next to each other (as fromCache does).
func eventIDs(keys []pending) []uuid.UUID {
	ids := make([]uuid.UUID, 0, len(keys))
	for i, k := range keys {
		if i > 0 && keys[i-1].event == k.event {
			continue
		}
		ids = append(ids, k.key.EventID)
	}
	return ids
}
