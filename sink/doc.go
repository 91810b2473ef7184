// Package sink is the Postgres side of onceflow's pipeline: one transaction
// per partition batch.
//
// [Writer.Write] runs the contract in order: drop keys the dedup cache knows
// are committed, BEGIN, claim processed_events rows, let every [Handler]
// write for the events it claimed, record dead letters, compare-and-set the
// partition's next offset in sink_offsets, COMMIT, and only then remember
// the claimed keys in the cache. The caller (package processor) commits the
// Kafka offset only after Write returns nil.
//
// Handlers are Go code ([Handler]) or one SQL statement each
// ([SQLHandler], the no-code path: the statement reads the claimed events
// from a relation named events). A handler that is a [TopicFilter] claims
// and applies only the events of its topics.
//
// The offset compare-and-set fences zombies: a batch carries the stored
// offset its worker last saw ([Batch.Fence]); if another member moved it in
// the meantime the transaction rolls back with [ErrFenced].
package sink
