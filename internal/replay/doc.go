// Package replay rewinds a consumer group, or backfills one handler, for
// `onceflow replay`. It works beside the pipeline, not in it: it reads and
// writes sink's tables (sink_offsets, processed_events, dead_letters,
// sink_replays) and Kafka's committed offsets, while the group is stopped.
//
// # What a rewind does
//
// A rewind moves, for each partition of the group's topics, the next
// offset back to a target: the first record at or after a time, an offset
// given per partition, or the log start. A partition whose stored offset
// is out of range (below its log start, beyond its end, or stored under
// another topic id: the topic recreated since) goes to its log start,
// where a member would start it, forward if need be; a rewind of only
// those partitions (Target.OutOfRange) is what a partition a member left
// paused waits for. It writes both places a member
// resumes from, Postgres first (the truth, read on assignment) and then
// Kafka's committed offsets, and takes a new epoch for every partition it
// moves, so that a member that slipped in despite the check below is
// fenced on its next batch and cannot store an offset over the rewind.
// Each moved partition whose records the group reads again gets a
// sink_replays row (from where, to where, which handler, whether forced);
// the records of a recreated topic are read for the first time. The
// topic's id today is stored with every target.
//
// The group must be stopped: Rewind asks the group coordinator and refuses
// while the group has members. The brokers list a member that crashed
// until its session timeout expires, and a static member that stopped
// too (it keeps its place for a restart); the refusal says which and for
// how long. RemoveStaticMembers removes stopped static members, but only
// when that leaves the group empty: it removes nothing when the rewind
// would be refused anyway. CheckStopped tells, without changing anything,
// whether a rewind would be refused. A target past the group's position is
// refused: that would skip records, not replay them (a partition out of
// range is at its log start).
//
// # Why replaying is safe, and its horizon
//
// Replayed records go through the normal pipeline: every (event, handler)
// pair already in processed_events is skipped, so a replay applies nothing
// twice — as long as the rows are there. They are kept for the dedup
// horizon (dedup.retention, see dedup.Retention; 0 keeps them for ever);
// a rewind reaching a record older than the horizon may apply its effects
// again, so Rewind refuses it unless the caller sets
// Request.RiskReapplyingEffects. [Config.Horizon] is that retention; 0
// means unlimited.
//
// # Backfilling one handler
//
// A handler added after the group has run has applied nothing of the
// history its siblings applied. Backfill is a rewind (to the log start by
// default) with the new handler among the group's handlers: dedup is per
// (event, handler), so on the replayed records every sibling finds its
// processed_events row and skips, and only the new handler claims and
// applies. We chose this over a separate consumer group running only the
// new handler because it needs no second pipeline, no second set of
// sink_offsets rows to reconcile, and no handler subset in the running
// code: the exactness argument is the one the pipeline already makes for
// every redelivery. Its price: the group is stopped for the rewind, and
// reads the history again (siblings' skips are cheap: one claim round trip
// per batch). A sibling applies a replayed event only if it never applied
// it — exactly what it would have done on first delivery; the dry run
// counts such pairs per handler so that an operator sees them before.
//
// # Dry run
//
// [Replayer.Count] reads the records between the target and the current
// position, decodes them as the pipeline does, and counts per partition
// and handler the pairs that would be applied, skipped as duplicates (a
// processed_events row, or an earlier record of the range), dead-lettered
// as conflicting duplicates, or refused by the handlers' shared parse
// (Config.Parse: dead letters); per partition, the records the decoder
// refuses (dead letters). Events a handler dead-lettered on an earlier
// read (a dead letter at their offset) are counted apart: the handlers
// run on them again. What only running the handlers tells — whether one
// refuses an event now, or accepts one it refused — the counts cannot
// know; they assume each handler answers as before. It writes nothing.
package replay
