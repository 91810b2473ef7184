package processor_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// A record dead-lettered while decoding whose id was readable (from the
// configured JSON field, as far as the value parses) has its dead letter
// stored under that id, so that an audit of the id finds it.
func TestUndecodableRecordKeepsItsID(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		nul, large, good := uuid.New(), uuid.New(), uuid.New()
		val := func(id uuid.UUID, rest string) []byte {
			return []byte(`{"event_id":"` + id.String() + `","user_id":1,"items":["A"]` + rest + `}`)
		}
		e.produce(
			&kgo.Record{Topic: e.topic, Value: val(nul, `,"note":"\u0000"`)},
			&kgo.Record{Topic: e.topic, Value: val(large, `,"note":"`+strings.Repeat("x", 2000)+`"`)},
			&kgo.Record{Topic: e.topic, Value: val(good, "")},
		)
		ends := e.logEnds()
		cfg := e.config("field")
		cfg.Decode = processor.DecodeConfig{IDField: "event_id", MaxBytes: 1024}
		m := e.start(cfg, e.writer(0))
		e.waitStored(ends, 60*time.Second)
		m.stop(t)
		for _, id := range []uuid.UUID{nul, large} {
			a, err := sink.Audit(t.Context(), e.pool, e.schema, id, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(a.DeadLetters) != 1 || len(a.Processed) != 0 {
				t.Errorf("audit of %s: %d dead letters, %d processed rows; want its dead letter, nothing processed", id, len(a.DeadLetters), len(a.Processed))
			}
		}
		if a, err := sink.Audit(t.Context(), e.pool, e.schema, good, 0); err != nil || len(a.Processed) == 0 {
			t.Errorf("audit of the good record: %+v, %v; want it processed", a, err)
		}
	})
}
