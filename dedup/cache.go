package dedup

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Key identifies one handler's application of one event: the primary key of
// processed_events.
type Key struct {
	EventID uuid.UUID
	Handler string
}

// Cache is the LRU fast path: a bounded set of events whose claims by some
// handlers are known to be committed in Postgres, each with the payload
// digest it was claimed with (zero if unknown). Only call Remember after
// COMMIT succeeded; a key that is absent says nothing, so callers must then
// ask Postgres.
//
// One entry holds an event for all its handlers (a bit per handler name,
// up to MaxCacheHandlers distinct names per Cache; keys of further
// handlers are never cached), so its size counts events, whatever the
// number of handlers, and remembering a batch costs one update per event.
// An entry has one digest: keys remembered with another known digest than
// their event's entry (handlers of different topics that saw the id with
// different payloads) replace it, so the handlers it held are asked of
// Postgres again rather than compared with a digest they did not store.
//
// A nil *Cache is valid and disabled: Seen always reports false. Cache is
// safe for concurrent use.
type Cache struct {
	mu     sync.Mutex
	lru    *simplelru.LRU[uuid.UUID, entry]
	bits   map[string]uint64 // handler name -> its bit in entry.handlers
	hits   atomic.Int64
	misses atomic.Int64
}

// MaxCacheHandlers is how many distinct handler names one Cache holds keys
// of.
const MaxCacheHandlers = 64

// entry is what the cache knows of one event.
type entry struct {
	digest   Digest
	handlers uint64 // bits of the handlers whose claim is committed
}

// New returns a Cache holding at most size events. Size 0 returns a nil,
// disabled Cache; a negative size is an error.
func New(size int) (*Cache, error) {
	if size < 0 {
		return nil, fmt.Errorf("dedup cache size %d: must be >= 0", size)
	}
	if size == 0 {
		return nil, nil
	}
	l, err := simplelru.NewLRU[uuid.UUID, entry](size, nil)
	if err != nil {
		return nil, fmt.Errorf("dedup cache: %w", err)
	}
	return &Cache{lru: l, bits: map[string]uint64{}}, nil
}

// bit returns handler's bit, giving it the next one at its first use; 0
// when MaxCacheHandlers names have them all. c.mu must be held.
func (c *Cache) bit(handler string) uint64 {
	if b, ok := c.bits[handler]; ok {
		return b
	}
	if len(c.bits) >= MaxCacheHandlers {
		return 0
	}
	b := uint64(1) << len(c.bits)
	c.bits[handler] = b
	return b
}

// Seen reports whether k is known to be committed, and, if so, whether d
// conflicts with the digest it was committed with (both known and
// different: the event id was reused with another payload). It counts a hit
// or a miss; a conflict is a hit. It does not refresh k's recency.
func (c *Cache) Seen(k Key, d Digest) (seen, conflict bool) {
	if c == nil {
		return false, false
	}
	c.mu.Lock()
	b := c.bit(k.Handler)
	e, ok := c.lru.Peek(k.EventID)
	c.mu.Unlock()
	if ok && e.handlers&b != 0 {
		c.hits.Add(1)
		return true, e.digest.Conflicts(d)
	}
	c.misses.Add(1)
	return false, false
}

// Remember records keys whose claim is committed, digests[i] being the
// digest stored with keys[i] (digests may be nil or shorter: unknown).
// Keys of one event that are next to each other in keys cost one update.
// Call it only after the claiming transaction's COMMIT returned without
// error.
func (c *Cache) Remember(keys []Key, digests []Digest) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := 0; i < len(keys); {
		id := keys[i].EventID
		var add entry
		for ; i < len(keys) && keys[i].EventID == id; i++ {
			var d Digest
			if i < len(digests) {
				d = digests[i]
			}
			if add.digest.Conflicts(d) {
				continue // not cached: its handler is asked of Postgres
			}
			add.handlers |= c.bit(keys[i].Handler)
			if d != (Digest{}) {
				add.digest = d
			}
		}
		if add.handlers == 0 {
			continue
		}
		if e, ok := c.lru.Peek(id); ok && !e.digest.Conflicts(add.digest) {
			add.handlers |= e.handlers
			if add.digest == (Digest{}) {
				add.digest = e.digest
			}
		}
		c.lru.Add(id, add)
	}
}

// Stats is a snapshot of a Cache's counters.
type Stats struct {
	Len    int
	Hits   int64
	Misses int64
}

// Stats returns the cache's current size (events) and hit/miss counts (keys).
func (c *Cache) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	c.mu.Lock()
	n := c.lru.Len()
	c.mu.Unlock()
	return Stats{Len: n, Hits: c.hits.Load(), Misses: c.misses.Load()}
}
