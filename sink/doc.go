// Package sink is the Postgres side of onceflow's pipeline: one transaction
// per partition batch.
//
// [Writer.Write] runs the contract in order: drop keys the dedup cache knows
// are committed, BEGIN, claim processed_events rows, let every [Handler]
// write for the events it claimed, record dead letters, compare-and-set the
// partition's next offset in sink_offsets, COMMIT, and only then remember
// the claimed keys in the cache. The caller (package processor) commits the
// Kafka offset only after Write returns nil. A batch that asks for it
// ([Batch.DeferOffset]) and has nothing to write — every key claimed
// already, with the event's own payload, and its dead letters recorded
// already — is only looked up, outside any transaction, and leaves the
// stored offset as it is.
//
// Handlers are Go code ([Handler]) or one SQL statement each
// ([SQLHandler], the no-code path: the statement reads the claimed events
// from a relation named events). A handler that is a [TopicFilter] claims
// and applies only the events of its topics. A Go handler that passes
// event ids to Postgres in arrays passes them as pgtype.UUID: a
// []uuid.UUID has no text encoding, which the exec and simple_protocol
// query modes (default_query_exec_mode, behind a transaction pooler)
// need.
//
// The offset compare-and-set fences zombies: a batch carries the stored
// offset its worker last saw ([Batch.Fence]); if another member moved it in
// the meantime the transaction rolls back with [ErrFenced].
//
// A duplicate is checked before it is skipped: an event whose id was
// applied with another payload (its digest differs, in the cache or in
// processed_events) is a conflicting duplicate. It becomes a dead letter
// with [ReasonConflict], applies nothing for any handler (a claim it made
// for a handler new to the id is taken back), and the first version's
// effects stand; [Result.Conflicts] counts them.
package sink
