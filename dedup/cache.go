package dedup

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
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
	lru    *lru
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
// disabled Cache; a negative size, or one above 2³¹−1, is an error.
func New(size int) (*Cache, error) {
	if size < 0 {
		return nil, fmt.Errorf("dedup cache size %d: must be >= 0", size)
	}
	if size == 0 {
		return nil, nil
	}
	if size > maxCacheSize {
		return nil, fmt.Errorf("dedup cache size %d: at most %d", size, maxCacheSize)
	}
	return &Cache{lru: newLRU(size), bits: map[string]uint64{}}, nil
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
	e, ok := c.lru.peek(k.EventID)
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
		e, ok := c.lru.add(id)
		if ok && !e.digest.Conflicts(add.digest) {
			add.handlers |= e.handlers
			if add.digest == (Digest{}) {
				add.digest = e.digest
			}
		}
		*e = add
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
	n := c.lru.len()
	c.mu.Unlock()
	return Stats{Len: n, Hits: c.hits.Load(), Misses: c.misses.Load()}
}

// maxCacheSize is the most events a Cache holds: its slots are numbered
// with int32.
const maxCacheSize = 1<<31 - 1

// lru is the Cache's store: at most size entries, the least recently
// added evicted first. Its entries live in one slice, linked in order of
// their last add by slot numbers, and a map finds an event's slot: an add
// costs a look-up, and for a new event an insertion and the deletion of
// the one it evicts, with no allocation once the slice is full; and the
// slots, holding no pointers, are nothing for the garbage collector to
// scan. Not safe for concurrent use (Cache holds its mutex).
type lru struct {
	size       int
	at         map[uuid.UUID]int32
	slots      []slot
	head, tail int32 // most and least recently added; -1 when empty
}

type slot struct {
	id         uuid.UUID
	e          entry
	prev, next int32 // towards head and towards tail; -1 at the ends
}

func newLRU(size int) *lru {
	return &lru{size: size, at: make(map[uuid.UUID]int32, min(size, 1<<16)), head: -1, tail: -1}
}

func (l *lru) len() int { return len(l.at) }

// peek returns id's entry, without making it recent.
func (l *lru) peek(id uuid.UUID) (entry, bool) {
	i, ok := l.at[id]
	if !ok {
		return entry{}, false
	}
	return l.slots[i].e, true
}

// add makes id the most recent entry and returns it, and whether it was
// there already; a new entry is zero, and takes the least recent one's
// slot when the lru is full.
func (l *lru) add(id uuid.UUID) (*entry, bool) {
	if i, ok := l.at[id]; ok {
		l.unlink(i)
		l.pushFront(i)
		return &l.slots[i].e, true
	}
	var i int32
	if len(l.slots) < l.size {
		i = int32(len(l.slots))
		l.slots = append(l.slots, slot{})
	} else {
		i = l.tail
		delete(l.at, l.slots[i].id)
		l.unlink(i)
	}
	l.slots[i] = slot{id: id, prev: -1, next: -1}
	l.at[id] = i
	l.pushFront(i)
	return &l.slots[i].e, false
}

func (l *lru) unlink(i int32) {
	s := &l.slots[i]
	if s.prev >= 0 {
		l.slots[s.prev].next = s.next
	} else {
		l.head = s.next
	}
	if s.next >= 0 {
		l.slots[s.next].prev = s.prev
	} else {
		l.tail = s.prev
	}
	s.prev, s.next = -1, -1
}

func (l *lru) pushFront(i int32) {
	s := &l.slots[i]
	s.prev, s.next = -1, l.head
	if l.head >= 0 {
		l.slots[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}
