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
	c.Remember(keys[:100000])
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.Seen(keys[i%len(keys)])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
}

// BenchmarkClaim measures one claim of 1000 new keys in a transaction of its
// own, against the test Postgres.
func BenchmarkClaim(b *testing.B) {
	pool := sinktest.Pool(b)
	schema := sinktest.Schema(b, pool)
	table := pgx.Identifier{schema, "processed_events"}.Sanitize()
	ctx := b.Context()
	const n = 1000
	keys := make([]dedup.Key, n)
	for b.Loop() {
		for i := range keys {
			keys[i] = dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := dedup.Claim(ctx, tx, table, "kafka", "", keys)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "keys/s")
}
