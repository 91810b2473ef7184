package processor

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestRepeatsHoldBackALineSaidAgain(t *testing.T) {
	var r repeats
	t0 := time.Unix(1000, 0)
	if ok, held := r.allow("a", t0); !ok || held != 0 {
		t.Fatalf("first line: %v, %d", ok, held)
	}
	for i := range 5 {
		if ok, _ := r.allow("a", t0.Add(time.Duration(i+1)*time.Second)); ok {
			t.Fatalf("the same line %ds later was logged", i+1)
		}
	}
	if ok, _ := r.allow("b", t0.Add(time.Second)); !ok {
		t.Fatal("another line was held back")
	}
	if ok, held := r.allow("a", t0.Add(repeatWindow)); !ok || held != 5 {
		t.Fatalf("the line a window later: %v, held %d; want logged, 5 held", ok, held)
	}
	for i := range maxRepeatKeys + 1 {
		r.allow(string(rune('c'+i)), t0)
	}
	if len(r.last) > maxRepeatKeys {
		t.Fatalf("%d lines remembered, want at most %d", len(r.last), maxRepeatKeys)
	}
}

// franz-go says a failing group loop again every few seconds with a new
// consecutive_errors and backoff each time (an instance id another live
// member holds, under the consumer protocol): it is one line a minute,
// not one every retry.
func TestKafkaLoopErrorsAreHeldBackAcrossRetries(t *testing.T) {
	var buf bytes.Buffer
	l := kgoLogger{log: slog.New(slog.NewTextHandler(&buf, nil)), seen: &repeats{}}
	for i := range 8 {
		l.Log(kgo.LogLevelError, "group manage loop errored", "group", "g", "err", "UNRELEASED_INSTANCE_ID",
			"consecutive_errors", i+1, "backoff", time.Duration(i+1)*271*time.Millisecond)
	}
	if n := strings.Count(buf.String(), "group manage loop errored"); n != 1 {
		t.Fatalf("the loop's error logged %d times over 8 retries, want once:\n%s", n, buf.String())
	}
	l.Log(kgo.LogLevelError, "group manage loop errored", "group", "g", "err", "COORDINATOR_NOT_AVAILABLE",
		"consecutive_errors", 9, "backoff", time.Second)
	if n := strings.Count(buf.String(), "group manage loop errored"); n != 2 {
		t.Fatalf("another error of the loop was held back:\n%s", buf.String())
	}
}
