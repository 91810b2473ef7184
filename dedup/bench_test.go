package dedup_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// BenchmarkCacheSeen measures the LRU fast path on a full cache, half hits.
func BenchmarkCacheSeen(b *testing.B) {
	c, _ := dedup.New(100000)
	keys := make([]dedup.Key, 200000)
	for i := range keys {
		keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
	}
	c.Remember(keys[:100000], nil)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.Seen(keys[i%len(keys)], dedup.Digest{})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
}

// BenchmarkClaim measures one claim of 1000 new keys in a transaction of its
// own, against the test Postgres.
func BenchmarkClaim(b *testing.B) {
	pool := sinktest.Pool(b)
	schema := sinktest.Schema(b, pool)
	ctx := b.Context()
	const n = 1000
	keys := make([]dedup.Key, n)
	for b.Loop() {
		for i := range keys {
			keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := dedup.Claim(ctx, tx, schema, "kafka", "", keys, nil)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkPayloadDigest measures the digest of a seed-sized order payload,
// computed once per event on every path.
func BenchmarkPayloadDigest(b *testing.B) {
	payload := []byte(`{"user_id":12345,"items":["A","B","C"]}`)
	for b.Loop() {
		dedup.PayloadDigest(payload)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "digests/s")
}

// BenchmarkLookupClaim measures the writer's claim of 1000 keys, all new
// ("new") and all already claimed ("duplicates": the look-up finds them
// with their digests, nothing is copied), each in a transaction of its
// own, against the test Postgres.
func BenchmarkLookupClaim(b *testing.B) {
	pool := sinktest.Pool(b)
	schema := sinktest.Schema(b, pool)
	ctx := b.Context()
	const n = 1000
	keys := make([]dedup.Key, n)
	digests := make([]dedup.Digest, n)
	fill := func() {
		for i := range keys {
			keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
			digests[i] = dedup.PayloadDigest(keys[i].EventID[:])
		}
	}
	claim := func(b *testing.B, want bool) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			c, err := dedup.LookupClaim(ctx, tx, schema, "kafka", "", keys, digests)
			if err == nil && (c.Claimed[0] != want || c.Found[0] == want) {
				b.Fatalf("claimed %v, found %v: want claimed %v", c.Claimed[0], c.Found[0], want)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Run("new", func(b *testing.B) {
		for b.Loop() {
			fill()
			claim(b, true)
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
	})
	b.Run("duplicates", func(b *testing.B) {
		fill()
		claim(b, true)
		for b.Loop() {
			claim(b, false)
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
	})
}

// BenchmarkClaimOnePresent measures a claim of 1000 keys of which one is
// claimed already, in the middle of the batch's key order: the COPY fails
// on it, and the claim looks the keys up and COPYs the others.
func BenchmarkClaimOnePresent(b *testing.B) {
	pool := sinktest.Pool(b)
	schema := sinktest.Schema(b, pool)
	ctx := b.Context()
	const n = 1000
	keys := make([]dedup.Key, n)
	for b.Loop() {
		for i := range keys {
			keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
		}
		keys[0].EventID[0] = 0x80 // the middle of the order
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := dedup.Claim(ctx, tx, schema, "kafka", "", keys[:1], nil)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		var claimed []bool
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			claimed, err = dedup.Claim(ctx, tx, schema, "kafka", "", keys, nil)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if claimed[0] || !claimed[1] {
			b.Fatalf("claimed[0] = %v, claimed[1] = %v: want false, true", claimed[0], claimed[1])
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkCacheRemember measures remembering batches of 1 000 new events
// into a full cache of 100 000: an insertion and an eviction each.
func BenchmarkCacheRemember(b *testing.B) {
	c, _ := dedup.New(100000)
	keys := make([]dedup.Key, 300000)
	for i := range keys {
		keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
	}
	c.Remember(keys[:100000], nil)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		j := (i * 1000) % (len(keys) - 1000)
		c.Remember(keys[j:j+1000], nil)
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkInsertClaim measures InsertClaim of 1000 keys with their
// digests, of which 300 were claimed before (a steady stream's
// redeliveries), each in a transaction of its own.
func BenchmarkInsertClaim(b *testing.B) {
	pool := sinktest.Pool(b)
	schema := sinktest.Schema(b, pool)
	ctx := b.Context()
	const n, present = 1000, 300
	keys := make([]dedup.Key, n)
	digests := make([]dedup.Digest, n)
	for b.Loop() {
		for i := range keys {
			keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
			digests[i] = dedup.PayloadDigest(keys[i].EventID[:])
		}
		var c dedup.Claims
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			if _, err = dedup.InsertClaim(ctx, tx, schema, "kafka", "", keys[:present], digests[:present]); err != nil {
				return err
			}
			c, err = dedup.InsertClaim(ctx, tx, schema, "kafka", "0af7651916cd43dd8448eb211c80319c", keys, digests)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if c.Claimed[0] || !c.Claimed[n-1] {
			b.Fatalf("claimed[0] = %v, claimed[%d] = %v: want false, true", c.Claimed[0], n-1, c.Claimed[n-1])
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
}
