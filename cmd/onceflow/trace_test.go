package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/sink"
)

// storyOf runs `onceflow trace --json` for id against s's schema and
// Jaeger, and decodes its answer.
func storyOf(t *testing.T, s *seedServer, query, service, id string) story {
	t.Helper()
	var stderr bytes.Buffer
	out, err := runCLI(t, &stderr, "trace", id, "--json", "--dsn", sinkDSN(t), "--schema", s.schema,
		"--jaeger", query, "--service", service)
	if err != nil {
		t.Fatalf("trace %s: %v\n%s", id, err, stderr.String())
	}
	var st story
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("trace %s --json: %v\n%s", id, err, out)
	}
	return st
}

func sinkDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("ONCEFLOW_TEST_POSTGRES_DSN")
	if dsn == "" {
		t.Fatal("ONCEFLOW_TEST_POSTGRES_DSN is not set")
	}
	return dsn
}

// traceOf returns the story's trace with role whose Detail holds detail,
// failing if there is none or it is not in Jaeger.
func traceOf(t *testing.T, st story, role, detail string) *storyTrace {
	t.Helper()
	for _, tr := range st.Traces {
		if tr.Role == role && strings.Contains(tr.Detail, detail) {
			if !tr.Found || len(tr.Spans) == 0 {
				t.Errorf("event %s: %s trace %s is not in Jaeger", st.EventID, role, tr.TraceID)
			}
			return tr
		}
	}
	var roles []string
	for _, tr := range st.Traces {
		roles = append(roles, tr.Role+" ("+tr.Detail+")")
	}
	t.Fatalf("event %s: no %s trace (%q); traces: %v", st.EventID, role, detail, roles)
	return nil
}

// names lists every span name of the trees under spans, depth first.
func names(spans []*storySpan) []string {
	var out []string
	for _, sp := range spans {
		out = append(out, sp.Name)
		out = append(out, names(sp.Children)...)
	}
	return out
}

// hasPath reports whether the trees hold a span named parent with a
// descendant named child.
func hasPath(spans []*storySpan, parent, child string) bool {
	for _, sp := range spans {
		if sp.Name == parent && slices.Contains(names(sp.Children), child) {
			return true
		}
		if hasPath(sp.Children, parent, child) {
			return true
		}
	}
	return false
}

// `onceflow trace` tells an event's story from Postgres and a real Jaeger:
// for a normal event its ingest (request → relay) and the batch that
// applied it (claim, handlers, commit); for a replayed one also the
// replay's publish and the batch that read it again and skipped it; for a
// dead-lettered one (a conflicting duplicate) the batch that wrote its dead
// letter; for an unknown id a clear message and exit status 1. The text
// form is a tree with durations and a link per trace.
func TestTraceTellsTheEventsStory(t *testing.T) {
	query, otlp := os.Getenv(envJaegerQuery), os.Getenv(envJaegerOTLP)
	if query == "" || otlp == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s and %s are not set and CI is: the trace test needs Jaeger (infra/jaeger.sh start)", envJaegerQuery, envJaegerOTLP)
		}
		t.Skipf("%s/%s not set: skipping the Jaeger test", envJaegerQuery, envJaegerOTLP)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	service := "onceflow-trace-" + hex.EncodeToString(b[:])
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", service)

	s := startSeedServer(t)
	normal := "7f8a0000-0000-0000-0000-0000000000f1"
	replayed := "7f8a0000-0000-0000-0000-0000000000f2"
	dead := "7f8a0000-0000-0000-0000-0000000000f3"
	for _, id := range []string{normal, replayed, dead} {
		if code, _, body := s.post(id, order); code != 200 {
			t.Fatalf("POST %s: %d %v", id, code, body)
		}
		s.audit(id, func(a map[string]any) bool { return len(processed(a)) == 4 })
	}
	if code, _, body := s.do("POST", "/demo/replay-event/"+replayed, nil, ""); code != 200 {
		t.Fatalf("replay: %d %v", code, body)
	}
	if code, _, body := s.do("POST", "/demo/replay-event/"+dead, nil, `{"user_id":2,"items":["B"]}`); code != 200 {
		t.Fatalf("replay with another payload: %d %v", code, body)
	}
	s.audit(dead, func(a map[string]any) bool { dl, _ := a["dead_letters"].([]any); return len(dl) == 1 })
	s.drained()
	s.stop() // flushes the spans

	// Jaeger indexes what it received within a moment: wait for the
	// dead letter's batch, the last trace exported.
	var st story
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = storyOf(t, s, query, service, dead)
		if slices.ContainsFunc(st.Traces, func(tr *storyTrace) bool { return tr.Role == "dead letter" && tr.Found }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead-letter batch trace in Jaeger after 30s: %+v", st)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].TraceID == "" || st.DeadLetters[0].Reason != sink.ReasonConflict {
		t.Errorf("dead-lettered event's dead letters = %+v, want one conflict with its batch's trace id", st.DeadLetters)
	}
	dl := traceOf(t, st, "dead letter", sink.ReasonConflict)
	if !slices.Contains(names(dl.Spans), "onceflow.batch") {
		t.Errorf("dead letter's trace has no onceflow.batch span: %v", names(dl.Spans))
	}
	traceOf(t, st, "published", "replay")

	st = storyOf(t, s, query, service, normal)
	ingest := traceOf(t, st, "ingest", "")
	if !hasPath(ingest.Spans, "POST /events-outbox/{bus}", "outbox.relay") {
		t.Errorf("ingest trace lacks the request → relay path: %v", names(ingest.Spans))
	}
	applied := traceOf(t, st, "applied", "emailHandler")
	if applied.TraceID != st.Processed[0].TraceID || !hasPath(applied.Spans, "onceflow.batch", "sink.commit") ||
		!hasPath(applied.Spans, "onceflow.batch", "dedup.claim") {
		t.Errorf("applied trace %s (processed_events says %s) lacks batch → claim and commit: %v",
			applied.TraceID, st.Processed[0].TraceID, names(applied.Spans))
	}
	if slices.ContainsFunc(st.Traces, func(tr *storyTrace) bool { return tr.Role == "re-read" || tr.Role == "dead letter" }) {
		t.Errorf("normal event's story has re-reads or dead letters: %+v", st.Traces)
	}
	for i := 1; i < len(st.Traces); i++ {
		if st.Traces[i].Start.Before(st.Traces[i-1].Start) {
			t.Errorf("traces not in time order: %s at %v after %s at %v", st.Traces[i].Role, st.Traces[i].Start,
				st.Traces[i-1].Role, st.Traces[i-1].Start)
		}
	}

	st = storyOf(t, s, query, service, replayed)
	traceOf(t, st, "applied", "emailHandler")
	reread := traceOf(t, st, "re-read", "skipped")
	if !slices.Contains(names(reread.Spans), "onceflow.batch") {
		t.Errorf("re-read trace has no onceflow.batch span: %v", names(reread.Spans))
	}
	replay := traceOf(t, st, "published", "replay")
	if !hasPath(replay.Spans, "POST /demo/replay-event/{id}", "outbox.relay") {
		t.Errorf("replay's trace lacks the request → publish path: %v", names(replay.Spans))
	}

	// The text form: the rows, then a tree per trace with durations and links.
	var stderr bytes.Buffer
	out, err := runCLI(t, &stderr, "trace", replayed, "--dsn", sinkDSN(t), "--schema", s.schema, "--jaeger", query, "--service", service)
	if err != nil {
		t.Fatalf("trace %s: %v\n%s", replayed, err, stderr.String())
	}
	for _, want := range []string{"event " + replayed, "applied: emailHandler", "re-read — ", query + "/trace/" + reread.TraceID,
		"└─ onceflow.batch  ", "ms  orders/", "skipped 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace's text lacks %q:\n%s", want, out)
		}
	}
	t.Logf("onceflow trace %s:\n%s", replayed, out)

	// An id onceflow never saw: a clear message, nothing on stdout, exit 1.
	stderr.Reset()
	unknown := "7f8a0000-0000-0000-0000-0000000000ff"
	out, err = runCLI(t, &stderr, "trace", unknown, "--dsn", sinkDSN(t), "--schema", s.schema, "--jaeger", query, "--service", service)
	var exit exitError
	if !errors.As(err, &exit) || exit != 1 || out != "" || !strings.Contains(stderr.String(), "has no record of it") {
		t.Errorf("trace of an unknown id: err %v, stdout %q, stderr %q; want exit 1, nothing, a message", err, out, stderr.String())
	}
	if _, err := runCLI(t, &stderr, "trace", "not-a-uuid", "--dsn", sinkDSN(t)); err == nil || !strings.Contains(err.Error(), "not a UUID") {
		t.Errorf("trace of a malformed id: %v, want an error naming it", err)
	}
}
