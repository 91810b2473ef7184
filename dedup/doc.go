// Package dedup is the deduplication step of onceflow's pipeline, between
// batching (package processor) and the transaction (package sink).
//
// Deduplication has two layers, keyed by (event id, handler):
//
//   - [Cache], an in-memory LRU of keys known to be committed. It is a hint:
//     a key enters it only after the transaction that claimed it committed,
//     so a hit is always safe to skip and a miss always goes to Postgres.
//   - [Claim], the truth: one INSERT … ON CONFLICT DO NOTHING RETURNING into
//     processed_events per batch, inside the batch's transaction. A row that
//     the statement did not return was claimed by an earlier (or concurrent,
//     now committed) transaction, or appears earlier in the same batch.
package dedup
