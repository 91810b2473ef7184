package processor_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/onceflow/onceflow/orders"
)

// A member told to consume a topic the brokers do not have says so — a
// warning naming the topic, once — and when the topic is created, says
// that too and consumes it.
func TestMissingTopicWarns(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		missing := e.topic + "-later"
		logs := &logRecorder{}
		cfg := e.config("missing-topic")
		cfg.Topics = []string{missing}
		cfg.Logger = slog.New(logs)
		m := e.start(cfg, e.writer(0))
		defer m.stop(t)

		rec := waitLogged(t, logs, slog.LevelWarn, "does not exist", 30*time.Second)
		if rec["topic"] != missing {
			t.Errorf("the warning names topic %q, want %q: %v", rec["topic"], missing, rec)
		}

		createTopic(t, e.brokers, missing, 1, nil)
		waitLogged(t, logs, slog.LevelInfo, "exists now", 30*time.Second)
		stream, err := orders.Generate(50, 0, 7)
		if err != nil {
			t.Fatal(err)
		}
		e.topic = missing
		e.produceMessages(stream.Messages)
		e.waitProcessed(50, 60*time.Second)
		if n := logs.count(slog.LevelWarn, "does not exist"); n != 1 {
			t.Errorf("the missing topic was warned about %d times, want once", n)
		}
	})
}

// waitLogged waits until logs holds a record at level whose message
// contains s, and returns it.
func waitLogged(t *testing.T, logs *logRecorder, level slog.Level, s string, timeout time.Duration) map[string]string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if rec, ok := logs.find(level, s); ok {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing logged at %v containing %q within %v; logged: %v", level, s, timeout, logs.messages())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
