package processor_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/wire"
)

// A partition fed by a transactional producer holds, besides the records,
// a commit or abort marker per transaction, and the records of aborted
// transactions. A member reads past them as Kafka's own consumer does:
// once every committed record is applied its lag is 0, and the offset
// stored in Postgres, the one committed to Kafka and the partition's
// CommittedOffset are the log end, past the trailing markers and the
// aborted records; records after a marker are applied, the aborted ones
// never. The records of a transaction still open are not lag (they
// cannot be read yet), also for a member that takes the partition then.
func TestTransactionMarkersAreReadPast(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(9, 0, 32)
		if err != nil {
			t.Fatal(err)
		}
		msgs := stream.Messages
		want := map[uuid.UUID]orders.Order{}
		keep := func(ms []orders.Message) []orders.Message {
			for _, m := range ms {
				want[m.ID] = stream.Unique[m.ID]
			}
			return ms
		}
		tx := e.client(kgo.TransactionalID("tx-"+e.group), kgo.DefaultProduceTopic(e.topic))
		// 0-2 committed, 3 its marker; 4-5 aborted, 6 the abort marker.
		e.transaction(tx, keep(msgs[:3]), kgo.TryCommit)
		e.transaction(tx, msgs[3:5], kgo.TryAbort)

		m := e.start(e.config("txn-1"), e.writer(100))
		e.waitCaughtUp(m, 3, want)

		// A marker followed by more records: another transaction
		// (7-8, its marker 9), then a record of no transaction (10).
		e.transaction(tx, keep(msgs[5:7]), kgo.TryCommit)
		e.produceMessages(keep(msgs[7:8]))
		e.waitCaughtUp(m, 6, want)

		// An aborted transaction last: 11 aborted, 12 its marker.
		e.transaction(tx, msgs[:1], kgo.TryAbort)
		e.waitCaughtUp(m, 6, want)

		// A transaction left open (13), and a member that starts from the
		// stored offset: nothing to read, lag 0, until it commits.
		stable := e.logEnds()[0]
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		open := keep(msgs[8:9])
		if err := tx.ProduceSync(t.Context(), wire.NewRecord(e.topic, open[0].ID, open[0].Value)).FirstErr(); err != nil {
			t.Fatal(err)
		}
		m.stop(t)
		next := e.start(e.config("txn-2"), e.writer(100))
		waitWorkersEach(t, 1, next)
		if lag := next.c.Lag(); len(lag) != 1 || lag[0].Lag != 0 {
			t.Errorf("with a transaction open: Lag() = %+v, want lag 0 (its record cannot be read yet)", lag)
		}
		if got := e.storedOffsets()[0]; got != stable {
			t.Errorf("with a transaction open: stored offset %d, want %d", got, stable)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
		e.waitCaughtUp(next, 7, want)
		if s := next.c.Stats(); s.SkippedLRU+s.SkippedPostgres != 0 {
			t.Errorf("the next member skipped %d events as applied before, want none read again", s.SkippedLRU+s.SkippedPostgres)
		}
	})
}

// transaction produces msgs in one transaction of tx and ends it with end
// (commit or abort).
func (e *env) transaction(tx *kgo.Client, msgs []orders.Message, end kgo.TransactionEndTry) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	if err := tx.BeginTransaction(); err != nil {
		e.t.Fatalf("begin transaction: %v", err)
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
	}
	if err := tx.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce in a transaction: %v", err)
	}
	if err := tx.EndTransaction(ctx, end); err != nil {
		e.t.Fatalf("end transaction: %v", err)
	}
}

// waitCaughtUp waits until m applied the events of want (processed is
// their number, the aborted ones not among them) and reads nothing more:
// lag 0, and the log end as the partition's CommittedOffset, the offset
// stored in Postgres and the one committed to Kafka. It fails after 60s
// with what it saw.
func (e *env) waitCaughtUp(m *member, processed int64, want map[uuid.UUID]orders.Order) {
	e.t.Helper()
	e.waitProcessed(processed, 60*time.Second)
	end := e.logEnds()[0]
	adm := kadm.NewClient(e.client())
	deadline := time.Now().Add(60 * time.Second)
	for {
		lag := m.c.Lag()
		parts := m.c.Partitions()
		stored := e.storedOffsets()
		var kafka int64 = -1
		if committed, err := adm.FetchOffsets(e.t.Context(), e.group); err == nil {
			if o, ok := committed.Lookup(e.topic, 0); ok {
				kafka = o.At
			}
		}
		if len(lag) == 1 && lag[0].Lag == 0 && len(parts) == 1 && parts[0].CommittedOffset == end &&
			stored[0] == end && kafka == end {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("log end %d: within 60s Lag() = %+v, Partitions() = %+v, stored offsets %v, Kafka committed %d; "+
				"want lag 0 and the log end everywhere", end, lag, parts, stored, kafka)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := e.processed(); got != processed {
		e.t.Errorf("%d events processed, want %d (an aborted transaction's records applied?)", got, processed)
	}
	e.checkExactlyOnce(maps.Clone(want))
}
