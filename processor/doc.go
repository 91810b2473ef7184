// Package processor is the Kafka side of onceflow's pipeline: a franz-go
// consumer-group member that runs one worker goroutine per assigned
// partition. A worker decodes records (bad ones become dead letters),
// closes batches on max records, max bytes or linger, hands each batch to a
// [Writer] (package sink) as one transaction, and marks the Kafka offset
// only after that transaction committed.
//
// Rebalances follow franz-go's goroutine-per-partition shape, with
// BlockRebalanceOnPoll so callbacks never race the poll loop:
//
//   - assigned: read each partition's stored offset from Postgres, start a
//     worker, and start fetching from the stored offset when it is ahead of
//     Kafka's committed one (the process died between COMMIT and the Kafka
//     commit), so that costs no replay at all;
//   - revoked: each worker finishes its in-flight batch (or aborts it if
//     Postgres does not answer), exits, and the marked offsets are
//     committed synchronously before the rebalance goes on;
//   - lost: workers abort; nothing is committed.
//
// On context cancellation Run drains: workers finish their batches, offsets
// are committed, the member leaves the group, and Run returns.
package processor
