package sink

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"
)

// Event is one decoded record: an event id and its value, with where it
// came from.
type Event struct {
	ID uuid.UUID
	// Value is the record's value: JSON validated by the decoder, unless
	// the decoder takes values as bytes (processor.FormatBytes).
	Value     []byte
	Key       []byte   // the record's key, if any
	Headers   []Header // the record's headers, in record order
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
	// Producer is the span context the producer injected into the record's
	// headers, if any. The batch span links to it.
	Producer trace.SpanContext
	// Parsed is what [Config.Parse] made of the event, set on the events
	// handlers receive; nil without a Parse.
	Parsed any
}

// Header is a record header. Keys may repeat.
type Header struct {
	Key   string
	Value []byte
}

// DeadLetter is a record that could not be decoded or applied. Whoever
// wrote its Reason (a decoder, a handler's RejectError, a Postgres error,
// Parse), it is stored valid UTF-8 (each run of invalid bytes replaced by
// U+FFFD), with every NUL replaced by U+FFFD, and at most MaxReasonBytes
// long (the rest cut, and the cut noted): Postgres refuses text that is
// not, and a dead letter it refused would stop its partition.
type DeadLetter struct {
	Topic     string
	Partition int32
	Offset    int64
	EventID   uuid.NullUUID // set when the id itself was readable
	Reason    string
	Key       []byte
	Value     []byte
}

// Batch is a contiguous run of records of one partition, written in one
// transaction.
type Batch struct {
	Topic     string
	Partition int32
	// Epoch is the writer's lease on the partition (Writer.Take). The batch
	// commits only if sink_offsets still holds this epoch.
	Epoch int64
	// Fence is the next offset the worker expects stored: the lease's
	// offset, then each committed batch's NextOffset (-1: none stored yet).
	// The batch commits only if the row still holds it.
	Fence int64
	// NextOffset is the offset after the batch's last record: the value
	// stored in sink_offsets by the batch.
	NextOffset int64
	// TopicID, when Valid, is the Kafka topic id of the records: stored
	// with NextOffset, so that a later owner can tell an offset of this
	// topic from one of a topic recreated under the same name (Lease).
	TopicID     uuid.NullUUID
	Events      []Event
	DeadLetters []DeadLetter
	// DeferOffset lets a batch that has nothing to write but its offset
	// leave sink_offsets as it is: a batch whose dead letters, if any, are
	// in dead_letters at their offsets already, and every (event, handler)
	// key of which is claimed already with the event's own payload digest
	// — known to the cache, or found in Postgres by a look-up outside any
	// transaction. Write then begins no transaction,
	// writes nothing, and reports [Result.OffsetDeferred]; the stored
	// offset stays at Fence, which the caller's next batch carries again,
	// and whoever takes the partition before an offset is stored reads
	// those records again and finds them applied. Any other batch is
	// written as usual, offset included, one round trip (the look-up)
	// later. Meant for a replay's re-read: processor sets it while the
	// partition's previous batch was found whole, more records are queued
	// behind the batch, and an offset was stored less than a second ago.
	// Never set it on a retry: after a COMMIT whose outcome was lost, the
	// batch would be found whole by its own committed attempt, and the
	// offset stored then would not be the Fence the next batch carries.
	DeferOffset bool
	// AllowPrefix lets a Write whose isolation of culprits (see
	// [Writer.Write]) runs long commit part of the batch: once the
	// isolating transaction has used half of TxTimeout, it starts no new
	// savepoint group, and commits the events isolated so far — a prefix
	// of the batch, at least one event — with their effects, the dead
	// letters below the first event left, and that event's offset stored
	// instead of NextOffset ([Result.NextOffset]). The caller then writes
	// the records from Result.NextOffset on as a new batch, with that
	// offset as its Fence. So each transaction's work is bounded, however
	// many culprits the batch holds and however slow each round trip is.
	// Without it, the whole isolation must fit in one TxTimeout.
	AllowPrefix bool
	// Stop, with AllowPrefix, cuts an isolation short as half of TxTimeout
	// does: once it is closed, the isolating transaction starts no new
	// savepoint group and commits the prefix it has settled, at least one
	// event (it goes on until the batch's first event is settled, a few
	// groups, when none is yet), with the offset of the first event left
	// stored. Meant for a caller that must give the partition up soon (a
	// revoke, a shutdown): what its isolation settled is kept, and
	// whoever writes the partition next starts after it, instead of
	// isolating the same records again from the start. The commit is
	// fenced as any other (Epoch, Fence). Nil: never closed. Write only
	// receives from it.
	Stop <-chan struct{}
	// Isolate says that the batch continues one whose culprits were dense
	// (the rest of a batch that committed a prefix, most of it dead
	// letters): Write skips the plain transaction, which would most
	// likely fail, and isolates from the start, trying the events of a
	// failed group one by one while most events it settles are culprits.
	// It changes how many round trips the isolation takes, never what is
	// applied or dead-lettered.
	Isolate bool
}

// Result counts what one Write did. Keys are (event, handler) pairs.
type Result struct {
	Applied         int          // keys claimed and applied by their handler
	SkippedLRU      int          // keys dropped by the cache without a round trip
	SkippedPostgres int          // keys whose processed_events row already existed (or repeated in the batch)
	DeadLetters     int          // dead_letters rows inserted (decode failures, rejections, data errors, conflicts); one recorded before at its offset (a record read again) is neither inserted nor counted
	Rejected        []DeadLetter // events refused inside the transaction (rejected, isolated or conflicting), as stored; included in DeadLetters unless recorded before
	Conflicts       int          // dead letters inserted for conflicting duplicates (ReasonConflict), included in DeadLetters
	Attempts        int          // transactions begun: 1, or 2 when the batch's culprits had to be isolated (1 with Batch.Isolate); 0 when the offset was deferred
	// NextOffset is the offset after the records the Write settled:
	// Batch.NextOffset (stored, or deferred with OffsetDeferred), or less
	// when a batch with [Batch.AllowPrefix] committed a prefix: the
	// offset of the first event it left, which it stored. Nothing of the
	// records from NextOffset on was written; the counts above are of the
	// prefix.
	NextOffset int64
	// OffsetDeferred: the batch was found whole under Batch.DeferOffset,
	// and nothing was written; sink_offsets still holds Batch.Fence.
	OffsetDeferred bool
}

// Handler applies the business effects of a batch of events inside the
// batch's transaction. Apply receives only the events this handler newly
// claimed (of the topics it consumes, if it is a [TopicFilter]), in offset
// order, each event at most once; it must write in bulk
// (COPY, unnest arrays, pgx.Batch) rather than one statement per event.
// The slice is the Writer's again once Apply returns (it is reused for
// other batches): Apply must not keep it, nor a subslice; it may keep
// copies of the events, and what they point to.
//
// Apply must not commit or roll back tx. What an error does depends on its
// class (see [Classify]): a data error (an error wrapping *RejectError, or a
// Postgres data exception, constraint violation or program limit) makes
// the Writer isolate the events that cause it into dead letters and apply
// the rest; a transient error makes the whole batch retry; any other error
// (including a panic, which is recovered) also retries the batch, with
// backoff, and is logged as an error for an operator to fix. So a handler
// that can tell an event will never apply should return a *RejectError for
// it. A batch's handlers are called one after another; batches of
// different partitions are written concurrently, so one handler's Apply
// runs concurrently with itself, each call in its own transaction. A
// handler may be called several times for one batch, on subsets, when
// culprits are being isolated.
type Handler interface {
	// Name is the handler's stable identity: the handler column of
	// processed_events. Renaming a handler makes every event new to it.
	Name() string
	Apply(ctx context.Context, tx pgx.Tx, events []Event) error
}

// TopicFilter is implemented by a Handler that applies the events of some
// topics only. For a batch of a topic it does not consume, the Writer
// neither claims nor applies anything for it: no processed_events row is
// written for such an (event, handler) pair, so consuming the topic later
// makes its events new to the handler. Consumes must be safe for
// concurrent use and give the same answer for the same topic.
type TopicFilter interface {
	Consumes(topic string) bool
}
