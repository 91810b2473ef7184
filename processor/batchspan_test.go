package processor_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/wire"
)

// A batch span's onceflow.dead_letters counts the dead letters the batch
// inserted, those a handler rejected inside the transaction as well as
// the records that could not be decoded.
func TestBatchSpanCountsRejectedDeadLetters(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
		cfg := e.config("batchspan")
		cfg.TracerProvider = tp

		msgs := genMessages(t, 3, 332)
		var recs []*kgo.Record
		for _, m := range msgs {
			recs = append(recs, wire.NewRecord(e.topic, m.ID, m.Value))
		}
		recs = append(recs,
			wire.NewRecord(e.topic, uuid.New(), []byte(`{"user_id":1,"items":[]}`)),   // rejected by the handlers
			&kgo.Record{Topic: e.topic, Value: []byte(`{"user_id":1,"items":["A"]}`)}) // undecodable: no event_id header
		e.produce(recs...)
		ends := e.logEnds()
		m := e.start(cfg, e.writer(1000))
		e.waitStored(ends, 60*time.Second)
		m.stop(t) // every batch span ended

		var dead, batches int64
		for _, s := range rec.Ended() {
			if s.Name() != "onceflow.batch" {
				continue
			}
			batches++
			for _, a := range s.Attributes() {
				if a.Key == "onceflow.dead_letters" {
					dead += a.Value.AsInt64()
				}
			}
		}
		if batches == 0 {
			t.Fatal("no onceflow.batch span ended")
		}
		if dead != 2 {
			t.Errorf("onceflow.dead_letters sums to %d over %d batch spans, want 2 (one rejected by a handler, one undecodable)", dead, batches)
		}
	})
}
