package processor

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
)

// batchRecords is n records of the seed's orders, each with its event_id
// header and one more.
func batchRecords(n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "orders", Partition: 3, Offset: int64(100 + i),
			Value: []byte(`{"user_id":58,"items":["SKU-25","SKU-37"]}`),
			Headers: []kgo.RecordHeader{
				{Key: HeaderEventID, Value: []byte(uuid.NewString())},
				{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
			}}
	}
	return recs
}

func batchWorker() *worker {
	return &worker{c: &Consumer{log: slog.New(slog.NewTextHandler(io.Discard, nil))}, key: tp{"orders", 3}, ctx: context.Background()}
}

// Each event of a batch has its own record's headers, and an append to
// one event's headers (a handler's copy) leaves the next event's alone,
// though the batch's headers share one allocation.
func TestBatchHeadersPerEvent(t *testing.T) {
	recs := batchRecords(3)
	recs[1].Headers = recs[1].Headers[:1] // one header: the slab is carved by each record's count
	b, _, err := batchWorker().batch(recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 3 {
		t.Fatalf("%d events, want 3", len(b.Events))
	}
	for i, e := range b.Events {
		if len(e.Headers) != len(recs[i].Headers) {
			t.Fatalf("event %d: %d headers, want %d", i, len(e.Headers), len(recs[i].Headers))
		}
		for j, h := range e.Headers {
			if h.Key != recs[i].Headers[j].Key || !bytes.Equal(h.Value, recs[i].Headers[j].Value) {
				t.Errorf("event %d header %d = %s: %q, want %s: %q", i, j, h.Key, h.Value, recs[i].Headers[j].Key, recs[i].Headers[j].Value)
			}
		}
	}
	first := b.Events[0].Headers
	_ = append(first, first[0])
	if got := b.Events[2].Headers[0].Key; got != HeaderEventID {
		t.Errorf("after an append to event 0's headers, event 2's first header is %q, want %q", got, HeaderEventID)
	}
}

// BenchmarkBatch measures decoding a batch of 1000 records of the seed's
// orders, each with two headers, into a sink.Batch.
func BenchmarkBatch(b *testing.B) {
	recs := batchRecords(1000)
	w := batchWorker()
	for b.Loop() {
		bt, _, err := w.batch(recs)
		if err != nil {
			b.Fatal(err)
		}
		w.events = bt.Events[:0]
	}
	b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "records/s")
}
