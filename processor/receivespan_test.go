package processor_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/wire"
)

// Each record's receive span (kotel's, from the client options) carries
// its event id as onceflow.event_id, so Jaeger's search by tag finds where
// an event was received; a record whose id is not a UUID (a dead letter)
// is received untagged.
func TestReceiveSpansCarryTheEventID(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
		cfg := e.config("receive")
		kt := kotel.NewKotel(kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(tp))))
		cfg.KafkaOptions = append(cfg.KafkaOptions, kgo.WithHooks(kt.Hooks()...))

		msgs := genMessages(t, 3, 331)
		want := map[string]bool{}
		var recs []*kgo.Record
		for _, m := range msgs {
			recs = append(recs, wire.NewRecord(e.topic, m.ID, m.Value))
			want[m.ID.String()] = true
		}
		bad := wire.NewRecord(e.topic, uuid.New(), msgs[0].Value)
		bad.Headers[0].Value = []byte("not-a-uuid")
		recs = append(recs, bad)
		e.produce(recs...)
		e.start(cfg, e.writer(1000))
		e.waitProcessed(3, 60*time.Second)

		got := map[string]bool{}
		untagged := 0
		deadline := time.Now().Add(30 * time.Second)
		for len(got)+untagged < len(recs) && time.Now().Before(deadline) {
			got, untagged = map[string]bool{}, 0
			for _, s := range rec.Ended() {
				if s.Name() != e.topic+" receive" {
					continue
				}
				tagged := false
				for _, a := range s.Attributes() {
					if a.Key == "onceflow.event_id" {
						got[a.Value.AsString()], tagged = true, true
					}
				}
				if !tagged {
					untagged++
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		for id := range want {
			if !got[id] {
				t.Errorf("no receive span tagged onceflow.event_id=%s; tagged: %v", id, got)
			}
		}
		if len(got) != len(want) || untagged != 1 {
			t.Errorf("receive spans: %d tagged (%v), %d untagged; want the 3 events tagged and the bad record untagged", len(got), got, untagged)
		}
	})
}
