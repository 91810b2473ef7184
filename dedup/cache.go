package dedup

import (
	"fmt"
	"sync/atomic"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"
)

// Key identifies one handler's application of one event: the primary key of
// processed_events.
type Key struct {
	EventID uuid.UUID
	Handler string
}

// Cache is the LRU fast path: a bounded set of keys whose claim is known to
// be committed in Postgres, each with the payload digest it was claimed
// with (zero if unknown). Only call Remember after COMMIT succeeded; a key
// that is absent says nothing, so callers must then ask Postgres.
//
// A nil *Cache is valid and disabled: Seen always reports false. Cache is
// safe for concurrent use.
type Cache struct {
	lru    *lru.Cache[Key, Digest]
	hits   atomic.Int64
	misses atomic.Int64
}

// New returns a Cache holding at most size keys. Size 0 returns a nil,
// disabled Cache; a negative size is an error.
func New(size int) (*Cache, error) {
	if size < 0 {
		return nil, fmt.Errorf("dedup cache size %d: must be >= 0", size)
	}
	if size == 0 {
		return nil, nil
	}
	l, err := lru.New[Key, Digest](size)
	if err != nil {
		return nil, fmt.Errorf("dedup cache: %w", err)
	}
	return &Cache{lru: l}, nil
}

// Seen reports whether k is known to be committed, and, if so, whether d
// conflicts with the digest it was committed with (both known and
// different: the event id was reused with another payload). It counts a hit
// or a miss; a conflict is a hit. It does not refresh k's recency.
func (c *Cache) Seen(k Key, d Digest) (seen, conflict bool) {
	if c == nil {
		return false, false
	}
	if stored, ok := c.lru.Peek(k); ok {
		c.hits.Add(1)
		return true, stored.Conflicts(d)
	}
	c.misses.Add(1)
	return false, false
}

// Remember records keys whose claim is committed, digests[i] being the
// digest stored with keys[i] (digests may be nil or shorter: unknown).
// Call it only after the claiming transaction's COMMIT returned without
// error.
func (c *Cache) Remember(keys []Key, digests []Digest) {
	if c == nil {
		return
	}
	for i, k := range keys {
		var d Digest
		if i < len(digests) {
			d = digests[i]
		}
		c.lru.Add(k, d)
	}
}

// Stats is a snapshot of a Cache's counters.
type Stats struct {
	Len    int
	Hits   int64
	Misses int64
}

// Stats returns the cache's current size and hit/miss counts.
func (c *Cache) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	return Stats{Len: c.lru.Len(), Hits: c.hits.Load(), Misses: c.misses.Load()}
}
