package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/config"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
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

// storyFound is storyOf once the story has a trace of each role Jaeger
// has spans of, asked again for up to 30 seconds: Jaeger indexes the
// exports it receives a moment later, each on its own.
func storyFound(t *testing.T, s *seedServer, query, service, id string, roles ...string) story {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := storyOf(t, s, query, service, id)
		missing := slices.DeleteFunc(slices.Clone(roles), func(role string) bool {
			return slices.ContainsFunc(st.Traces, func(tr *storyTrace) bool { return tr.Role == role && tr.Found && len(tr.Spans) > 0 })
		})
		if len(missing) == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s: no %v trace in Jaeger after 30s: %+v", id, missing, st)
		}
		time.Sleep(500 * time.Millisecond)
	}
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

	// Jaeger indexes what it received within a moment, and the spans came
	// in several exports: wait for every trace each story is to have.
	st := storyFound(t, s, query, service, dead, "dead letter", "published")
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].TraceID == "" || st.DeadLetters[0].Reason != sink.ReasonConflict {
		t.Errorf("dead-lettered event's dead letters = %+v, want one conflict with its batch's trace id", st.DeadLetters)
	}
	dl := traceOf(t, st, "dead letter", sink.ReasonConflict)
	if !slices.Contains(names(dl.Spans), "onceflow.batch") {
		t.Errorf("dead letter's trace has no onceflow.batch span: %v", names(dl.Spans))
	}
	traceOf(t, st, "published", "replay")

	st = storyFound(t, s, query, service, normal, "ingest", "applied")
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

	st = storyFound(t, s, query, service, replayed, "applied", "re-read", "published")
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

	// Under a service name that did not export the traces: the traces
	// Postgres names are found by id, and a note names their service.
	st = storyOf(t, s, query, service+"-not", normal)
	if notes := strings.Join(st.Notes, "\n"); !strings.Contains(notes, `exported under service "`+service+`"`) {
		t.Errorf("trace --service %s-not: notes %q, want one naming the service %s", service, st.Notes, service)
	}

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

// `onceflow trace` works on a schema only `run` has used (no outbox
// table) as on serve's: an id it has no record of gets the promised message and exit 1,
// and an id it knows gets its story. With Jaeger unreachable, trace still
// prints what Postgres knows, marks each trace "Jaeger unreachable", says
// so on standard error and in the JSON, and exits 0.
func TestTraceOnARunSchemaWithJaegerDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		also []migrate.Func
	}{
		{"run's tables", nil},
		{"serve's tables", []migrate.Func{outbox.Migrate}},
	} {
		t.Run(tc.name, func(t *testing.T) { traceWithJaegerDown(t, tc.also...) })
	}
}

func traceWithJaegerDown(t *testing.T, also ...migrate.Func) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, also...)
	applied := "7f8a0000-0000-0000-0000-0000000000a1"
	dead := "7f8a0000-0000-0000-0000-0000000000a2"
	traceID := "4bf92f3577b34da6a3ce929d0e0e4736"
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+q+`.processed_events (event_id, handler, bus, trace_id) VALUES ($1, 'noop', 'kafka', $2)`,
		applied, traceID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+q+`.dead_letters (consumer_group, topic, partition, "offset", event_id, reason)
VALUES ('g', 'orders', 1, 5, $1, 'decode: not JSON')`, dead); err != nil {
		t.Fatal(err)
	}
	down := "http://127.0.0.1:1"
	base := []string{"--dsn", sinkDSN(t), "--schema", schema, "--jaeger", down}

	var stderr bytes.Buffer
	unknown := "7f8a0000-0000-0000-0000-0000000000ff"
	out, err := runCLI(t, &stderr, append([]string{"trace", unknown}, base...)...)
	var exit exitError
	if !errors.As(err, &exit) || exit != 1 || out != "" || !strings.Contains(stderr.String(), "has no record of it") {
		t.Errorf("trace of an unknown id on a run schema: err %v, stdout %q, stderr %q; want exit 1, nothing, a message", err, out, stderr.String())
	}

	stderr.Reset()
	out, err = runCLI(t, &stderr, append([]string{"trace", applied}, base...)...)
	if err != nil {
		t.Fatalf("trace %s with Jaeger down: %v\n%s", applied, err, stderr.String())
	}
	for _, want := range []string{"event " + applied, "applied: noop at ", "trace " + traceID, "Jaeger unreachable"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace's text with Jaeger down lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr.String(), "does not answer") || !strings.Contains(stderr.String(), down) {
		t.Errorf("trace with Jaeger down: stderr %q, want a warning naming %s", stderr.String(), down)
	}

	stderr.Reset()
	out, err = runCLI(t, &stderr, append([]string{"trace", dead, "--json"}, base...)...)
	if err != nil {
		t.Fatalf("trace %s --json with Jaeger down: %v\n%s", dead, err, stderr.String())
	}
	var st struct {
		DeadLetters []deadRecord    `json:"dead_letters"`
		Traces      json.RawMessage `json:"traces"`
		JaegerError string          `json:"jaeger_error"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("trace --json: %v\n%s", err, out)
	}
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].Reason != "decode: not JSON" || string(st.Traces) != "[]" ||
		!strings.Contains(st.JaegerError, "does not answer") {
		t.Errorf("trace --json with Jaeger down = %s; want its dead letter, traces [] and jaeger_error", out)
	}
}

// serveOn starts serve on brokers in schema (a fresh one if ""), logging
// to logs; stop stops it and flushes its spans.
func serveOn(t *testing.T, brokers []string, schema string) (base string, stop func()) {
	t.Helper()
	cfg, err := config.Load("", nil, nil, config.Default{Key: "handlers", Value: registry.names})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Postgres.DSN, cfg.Postgres.Schema, cfg.HTTP.Addr = sinktest.DSN(t), schema, "127.0.0.1:0"
	cfg.Kafka.Brokers = brokers
	cfg.Batch.Linger = 10 * time.Millisecond
	a := &app{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := a.startServe(ctx, serveOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := s.wait(); err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	waitMigrated(t, s)
	return "http://" + s.addr, stop
}

// A dead-lettered event whose record a replay read again has both
// batches in its story: the one that wrote the dead letter and the
// replay's. Asked under a service Jaeger does not know, trace says so
// (with the services it knows) and prints "traces" as [].
func TestTraceShowsReReadsOfADeadLetter(t *testing.T) {
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

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_trace_")

	// A record that is not JSON, with its event id: dead-lettered, never
	// applied, so no later batch skips it as a duplicate.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	dead := "7f8a0000-0000-0000-0000-0000000000d1"
	if err := cl.ProduceSync(t.Context(), wire.NewRecord("orders", uuid.MustParse(dead), []byte("not json"))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	_, stop := serveOn(t, brokers, schema)
	waitFor(t, 30*time.Second, "the dead letter", func() bool {
		return sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1`, dead) == 1
	})
	stop()

	// Read it all again from the start.
	if out, err := runCLI(t, io.Discard, "replay", "--to-start", "--dsn", sinktest.DSN(t), "--schema", schema,
		"--brokers", strings.Join(brokers, ","), "--topics", "orders", "--group", "onceflow"); err != nil {
		t.Fatalf("replay --to-start: %v\n%s", err, out)
	}
	if n := sinktest.Count(t, pool, `SELECT max(next_offset) FROM `+schema+`.sink_offsets`); n != 0 {
		t.Fatalf("replay --to-start left the stored offset at %d", n)
	}
	_, stop = serveOn(t, brokers, schema)
	waitFor(t, 30*time.Second, "the replay's re-read", func() bool {
		return sinktest.Count(t, pool, `SELECT min(next_offset) FROM `+schema+`.sink_offsets`) >= 1
	})
	stop()

	s := &seedServer{t: t, schema: schema}
	var st story
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = storyOf(t, s, query, service, dead)
		found := func(role string) bool {
			return slices.ContainsFunc(st.Traces, func(tr *storyTrace) bool { return tr.Role == role && tr.Found })
		}
		if found("re-read") && found("dead letter") {
			break
		}
		if time.Now().After(deadline) {
			var roles []string
			for _, tr := range st.Traces {
				roles = append(roles, fmt.Sprintf("%s (%s) found %v", tr.Role, tr.Detail, tr.Found))
			}
			t.Fatalf("no dead-letter batch and re-read trace for the dead-lettered event after 30s: %q", roles)
		}
		time.Sleep(500 * time.Millisecond)
	}
	writer := traceOf(t, st, "dead letter", "@0")
	reread := traceOf(t, st, "re-read", "another batch that read orders/0@0")
	if writer.TraceID == reread.TraceID || len(st.Notes) != 0 {
		t.Errorf("dead letter trace %s, re-read %s, notes %q: want two traces and no note", writer.TraceID, reread.TraceID, st.Notes)
	}

	var stderr bytes.Buffer
	text, err := runCLI(t, &stderr, "trace", dead, "--dsn", sinkDSN(t), "--schema", schema, "--jaeger", query, "--service", service)
	if err != nil {
		t.Fatalf("trace %s: %v\n%s", dead, err, stderr.String())
	}
	for _, want := range []string{"dead letter: orders/0@0", "dead letter — the batch that dead-lettered orders/0@0", "re-read — another batch that read orders/0@0"} {
		if !strings.Contains(text, want) {
			t.Errorf("trace's text lacks %q:\n%s", want, text)
		}
	}
	t.Logf("onceflow trace %s:\n%s", dead, text)

	// Under another service name: the searches find nothing, and trace
	// says where the traces are.
	text, err = runCLI(t, &stderr, "trace", dead, "--dsn", sinkDSN(t), "--schema", schema, "--jaeger", query, "--service", service+"-not")
	if err != nil || !strings.Contains(text, "note: Jaeger knows no service") {
		t.Errorf("trace under another service: %v\n%s", err, text)
	}
	t.Logf("onceflow trace %s --service %s-not:\n%s", dead, service, text)
	out, err := runCLI(t, &stderr, "trace", dead, "--json", "--dsn", sinkDSN(t), "--schema", schema, "--jaeger", query, "--service", service+"-not")
	if err != nil {
		t.Fatalf("trace --service other: %v\n%s", err, stderr.String())
	}
	var raw struct {
		Traces json.RawMessage `json:"traces"`
		Notes  []string        `json:"notes"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	if string(raw.Traces) != "[]" || len(raw.Notes) != 1 || !strings.Contains(raw.Notes[0], `knows no service "`+service+`-not"`) {
		t.Errorf("trace under another service: traces %s, notes %q; want [] and a note saying Jaeger knows no such service", raw.Traces, raw.Notes)
	}
}
