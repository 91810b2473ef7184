package processor_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// A dead letter whose copy the broker refuses (the dead-letter topic does
// not exist yet) is published again after the backoff its log line gives,
// once the topic is there: not only when its lease runs out, which here is
// over 20 minutes away (2×ProduceTimeout + CallTimeout).
func TestRefusedDeadLetterCopyIsRetriedAfterBackoff(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		dlq := e.topic + ".late-dlq"
		logs := &logRecorder{}
		cfg := e.config("late-dlq")
		cfg.Logger = slog.New(logs)
		cfg.DeadLetterTopic = dlq
		cfg.ProduceTimeout = 10 * time.Minute
		msgs := genMessages(t, 2, 334)
		e.produce(wire.NewRecord(e.topic, msgs[0].ID, msgs[0].Value),
			&kgo.Record{Topic: e.topic, Value: []byte(`{"user_id":1,"items":["A"]}`)}, // undecodable: no event_id header
			wire.NewRecord(e.topic, msgs[1].ID, msgs[1].Value))
		e.start(cfg, e.writer(100))
		e.waitProcessed(2, 60*time.Second)

		deadline := time.Now().Add(60 * time.Second)
		for logs.count(slog.LevelWarn, "publish dead letters; retrying") == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("no refused dead-letter copy was logged within 60s; log: %v", logs.messages())
			}
			time.Sleep(20 * time.Millisecond)
		}
		createTopic(t, e.brokers, dlq, 1, nil)
		if got := e.consumeAll(dlq, 1, 60*time.Second); len(got) != 1 {
			t.Fatalf("dead-letter topic holds %d records within 60s of its creation, want the refused copy published again", len(got))
		}
		deadline = time.Now().Add(30 * time.Second)
		for sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE published_at IS NULL`) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the dead letter is on the topic but not marked published within 30s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
