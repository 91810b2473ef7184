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

// BenchmarkDuplicateCheck measures the duplicate path: a transaction that
// claims 1000 keys all already claimed, without ("claim") and with
// ("claim+digests") the digest comparison a writer adds for conflicting
// duplicates, against the test Postgres.
func BenchmarkDuplicateCheck(b *testing.B) {
	pool := sinktest.Pool(b)
	schema := sinktest.Schema(b, pool)
	table := pgx.Identifier{schema, "processed_events"}.Sanitize()
	ctx := b.Context()
	const n = 1000
	keys := make([]dedup.Key, n)
	digests := make([]dedup.Digest, n)
	for i := range keys {
		keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
		digests[i] = dedup.PayloadDigest(keys[i].EventID[:])
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := dedup.Claim(ctx, tx, schema, "kafka", "", keys, digests)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	for _, check := range []bool{false, true} {
		name := "claim"
		if check {
			name = "claim+digests"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := dedup.Claim(ctx, tx, schema, "kafka", "", keys, digests); err != nil {
						return err
					}
					if check {
						_, err := dedup.Digests(ctx, tx, table, keys)
						return err
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
		})
	}
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
