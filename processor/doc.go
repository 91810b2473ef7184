// Package processor is the Kafka side of onceflow's pipeline: a franz-go
// consumer-group member that runs one worker goroutine per assigned
// partition. A worker decodes records (bad ones become dead letters),
// closes batches on max records, max bytes or linger, hands each batch to a
// [Writer] (package sink) as one transaction, and marks the Kafka offset
// only after that transaction committed.
//
// # The invariant
//
// The offset stored in Postgres only ever advances over records whose
// effects or dead letters are in the same transaction. A worker writes its
// partition's batches in offset order, each starting where the previous
// committed one ended; once it gives a batch up without committing
// (told to stop while waiting to retry, fenced, aborted), it writes
// nothing more from what it holds: it exits and its queued records are
// dropped. Whoever writes the partition next starts again from the offset
// stored in Postgres.
//
// A batch found whole — every event applied before, by every handler —
// may leave its offset unstored (sink.Batch.DeferOffset) while the batch
// before it was found whole too, more records are queued behind it, and
// the partition's offset was stored less than a second ago: a replay's
// re-read then costs one look-up per batch, not a transaction. Kafka is
// not told of such a batch either. The stored offset lags by about a
// second of records found applied, at most, which the next owner reads
// again after a crash (or a lost partition, or a drain that timed out);
// the batch of a run's last records stores its
// offset, so a partition gone idle has it stored, and a worker told to
// stop (revoke, shutdown) stores it as it exits.
//
// # Nothing waits on one partition
//
// The poll loop never blocks on a worker: fetched records are queued to
// their partition's worker, and a partition whose queue is full (a slow or
// retrying worker) is paused with PauseFetchPartitions, its backlog left in
// Kafka, until the worker catches up. Dead letters are written to the
// dead_letters table in the batch's transaction; their copies reach the
// dead-letter topic asynchronously, from the table, so a broker that
// refuses one delays only the copy.
//
// # Memory
//
// What a Consumer holds of the stream is bounded by configuration and by
// what the producers wrote (their batch sizes, how well the data
// compresses), not by the backlog:
//
//   - fetches: franz-go keeps at most one fetch response per broker,
//     either in flight or buffered, and sends that broker its next fetch
//     only once the buffered one has been polled to the end (kgo's
//     MaxConcurrentFetches defaults to the number of brokers). A response
//     is at most FetchMaxBytes (a first batch larger than the limit still
//     comes, so a partition always progresses), each partition's share at
//     most FetchMaxPartitionBytes: brokers × FetchMaxBytes in all;
//   - queues: each poll moves everything buffered into the partitions'
//     queues, and a partition whose queue reached twice BatchMaxRecords
//     (at least 256 records) or twice BatchMaxBytes of values is paused.
//     A queue therefore holds at most its high water plus one fetch share
//     of the partition, decompressed: FetchMaxPartitionBytes on the wire
//     times the data's compression ratio, or one larger record batch
//     whole (Kafka returns the first partition's oversized first batch).
//     Shares queued at different polls stay together, so all queues hold
//     up to partitions × (high water + one decompressed share), plus
//     about 200 bytes of kgo.Record per record; a partition in hand of its
//     worker adds one batch. Stats.QueuedRecords and QueuedBytes say what
//     is queued now. (A response already in flight when its partition is
//     paused is dropped for it by franz-go and fetched again after the
//     resume: one share per pause.) Keeping the share small keeps this
//     small; a share below the producers' compressed batches makes each
//     response carry one partition's batch, which costs round trips only
//     with a distant broker.
//
// Record keys and values are not copied: franz-go decodes them in place,
// in the response (uncompressed batches) or in the batch's decompressed
// buffer, and allocates each batch's kgo.Records as one slice. A queued
// record therefore keeps its batch's buffer and records alive (for an
// uncompressed batch, the whole response it came in), so while queues
// are full a member holds more than the values it queues.
// With the defaults (16 MiB, 256 KiB, 1000 records, 4 MiB) and records of a
// few hundred bytes, fetches and queues stay in the tens of MiB; the LRU
// of package dedup adds about 200 bytes per entry (20 MiB at 100000).
//
// That is the live memory. The Go runtime lets the heap grow to twice the
// live memory before it collects (GOGC=100), so a member's resident size
// is about twice the above plus the runtime's own; set GOMEMLIMIT a
// little under the container's limit to make the runtime collect sooner
// instead of the kernel killing the process.
//
// # Transactional producers
//
// Records are read committed: an aborted transaction's records are never
// applied, and an open transaction's wait until it commits. A
// transaction's commit or abort marker (a control record) is queued like
// a record but is neither an event nor a dead letter: a batch's offset
// moves over it, and over the aborted records before it, as Kafka's
// consumer's position does, so the stored offset, the Kafka commit and
// Lag reach the log end when the last committed record is applied. A
// batch of markers alone stores just its offset. Lag counts to the last
// stable offset: the records of an open transaction are not in it.
//
// # Errors
//
// Errors are classified by sink.Classify: transient ones (connections,
// deadlocks, timeouts, a server restarting) are retried with capped
// backoff; data errors never reach the worker, because the Writer isolates
// the events that cause them into dead letters and applies the rest; a
// fence stops the worker; anything else is retried with backoff and
// logged as an error for an operator to fix.
//
// No transaction has to hold more than its timeout allows. A batch whose
// isolation of culprits runs long (many bad records, a slow link, a slow
// statement) commits the part it has settled, with its offset
// (sink.Batch.AllowPrefix), and the worker writes the rest as new
// batches, about twice the size of that part. A worker told to stop
// (revoked, drained at shutdown) while its batch isolates goes on for half
// of DrainTimeout, then commits the part settled so far at the next
// savepoint group (sink.Batch.Stop), at least
// the batch's first record, instead of waiting for DrainTimeout to abort
// it all: the next owner starts after it, so an isolation longer than the
// time between two rebalances still progresses with each owner rather
// than starting over. A transaction that times
// out makes the worker halve its batch size (down to one record) and
// write the same records again; the size doubles back after four batches
// in a row commit whole. A timeout is never taken as evidence against a
// record: nothing is dead-lettered because Postgres was slow.
//
// Decoding has its own classes when values are framed for a schema
// registry (FormatAvro, FormatProtobuf, through package registry): a
// record the registry cannot help with (not framed, an unknown schema id,
// a corrupt body) is a dead letter; a registry that is down or failing
// (registry.IsTransient) makes the worker decode the batch again after
// the same backoff, the partition paused, nothing dead-lettered; a
// registry refusing the credentials (registry.IsAuth) ends Run with that
// error.
//
// # Rebalances and fencing
//
// Franz-go's goroutine-per-partition shape, with BlockRebalanceOnPoll so
// callbacks never race the poll loop:
//
//   - assigned: each new partition is taken in Postgres (sink.Writer.Take
//     bumps its epoch, which fences any earlier owner's next write whether
//     or not the new owner has written), and consumption starts at the
//     offset stored there whenever one is, also when Kafka's committed
//     offset is ahead (a Postgres restored to an earlier point). A stored
//     offset outside the partition's log is logged as an error and handled
//     as Config.OffsetOutOfRange says;
//   - revoked: each worker finishes its in-flight batch within
//     DrainTimeout (or is aborted), exits, and the marked offsets are
//     committed synchronously before the rebalance goes on;
//   - lost: workers abort; nothing is committed;
//   - fenced: the worker stops; if the member still owns the partition a
//     session timeout later (by then a zombie that fenced it has learned
//     from the group that it is one), it takes the partition again and
//     starts from the stored offset;
//   - topic deleted (and perhaps recreated under the same name): the
//     brokers answer UNKNOWN_TOPIC_ID to every fetch by the old topic id,
//     and franz-go adopts no new id on its own. On those errors, or as
//     soon as its client's metadata shows the topic under a new id
//     (franz-go says so once; the errors came up to 25 s later), the
//     member stops the
//     topic's workers as on a revoke (what is queued of the old topic is
//     dropped; no Kafka offset is committed then), purges the topic from
//     its client and adds it again: a recreated topic is assigned again
//     as new, and each of its partitions whose offset Postgres stored
//     under the old topic id (sink.Lease.TopicID) starts from its log
//     start; a topic not recreated yet is waited for, as a missing one.
//     Each member of the group does so for the partitions it fetches.
//
// The callbacks come the same way under both group protocols
// (Config.GroupProtocol): under KIP-848's the broker assigns and revokes
// partitions a few at a time, as the cooperative-sticky balancer does
// under the classic one. A Kafka commit refused for the member's epoch
// (STALE_MEMBER_EPOCH, FENCED_MEMBER_EPOCH) is logged once per partition
// and epoch and changes nothing: the offsets stored in Postgres are the
// truth. A static member (Config.InstanceID) keeps its place in the group
// when it stops, and gets its partitions back if it returns within the
// session timeout, under both protocols also after a crash: under KIP-848's
// a restarted static member first sends the leave its killed predecessor
// never sent (the broker refuses a new member with a static member's
// instance id until that member has left).
//
// On context cancellation Run drains within DrainTimeout, commits, leaves
// the group and returns; Abort ends it at once, as a crash would (but for
// a COMMIT already sent, which is waited for and counted), and its
// client still leaves the group as it closes; Kill also keeps the client
// from saying anything more, as SIGKILL would: the member stays in the
// group until its session times out.
package processor
