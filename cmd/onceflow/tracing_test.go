package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// Environment naming the Jaeger the tracing test exports to and queries.
const (
	envJaegerQuery = "ONCEFLOW_TEST_JAEGER_QUERY" // e.g. http://127.0.0.1:16686
	envJaegerOTLP  = "ONCEFLOW_TEST_JAEGER_OTLP"  // e.g. http://127.0.0.1:4318
)

type otlpSpan struct {
	TraceID      string `json:"traceId"`
	SpanID       string `json:"spanId"`
	ParentSpanID string `json:"parentSpanId"`
	Name         string `json:"name"`
	Links        []struct {
		TraceID string `json:"traceId"`
		SpanID  string `json:"spanId"`
	} `json:"links"`
	Events []struct {
		Name       string     `json:"name"`
		Attributes []otlpAttr `json:"attributes"`
	} `json:"events"`
}

type otlpAttr struct {
	Key   string `json:"key"`
	Value struct {
		StringValue string `json:"stringValue"`
	} `json:"value"`
}

// jaegerSpans returns every span Jaeger holds for service.
func jaegerSpans(t *testing.T, base, service string, since time.Time) []otlpSpan {
	t.Helper()
	q := url.Values{
		"query.service_name":   {service},
		"query.start_time_min": {since.Add(-time.Minute).UTC().Format(time.RFC3339)},
		"query.start_time_max": {time.Now().Add(time.Minute).UTC().Format(time.RFC3339)},
		"query.num_traces":     {"100"},
	}
	resp, err := http.Get(base + "/api/v3/traces?" + q.Encode())
	if err != nil {
		t.Fatalf("query Jaeger: %v", err)
	}
	defer resp.Body.Close()
	var body struct {
		Result struct {
			ResourceSpans []struct {
				ScopeSpans []struct {
					Spans []otlpSpan `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("Jaeger answer: %v", err)
	}
	if body.Error != nil && !strings.Contains(strings.ToLower(body.Error.Message), "no traces found") {
		t.Fatalf("Jaeger: %s", body.Error.Message)
	}
	var out []otlpSpan
	for _, rs := range body.Result.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			out = append(out, ss.Spans...)
		}
	}
	return out
}

// An event's path is traced end to end into a real Jaeger: the request, the
// relay, the produce, and the batch that applied it — linked to the
// producer's span, with the dedup claim, each handler, the offset
// compare-and-set, COMMIT and the Kafka offset as its children. A replay's
// batch carries the dedup.skip event, and processed_events keeps the trace
// id that applied the event.
// Both OTLP transports are checked: HTTP on ONCEFLOW_TEST_JAEGER_OTLP and
// gRPC on ONCEFLOW_TEST_JAEGER_OTLP_GRPC (default: the same host, port 4317).
func TestTracesInJaeger(t *testing.T) {
	query, otlp := os.Getenv(envJaegerQuery), os.Getenv(envJaegerOTLP)
	if query == "" || otlp == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s and %s are not set and CI is: the tracing test needs Jaeger (infra/jaeger.sh start)", envJaegerQuery, envJaegerOTLP)
		}
		t.Skipf("%s/%s not set: skipping the Jaeger test", envJaegerQuery, envJaegerOTLP)
	}
	grpcEndpoint := os.Getenv("ONCEFLOW_TEST_JAEGER_OTLP_GRPC")
	if grpcEndpoint == "" {
		u, err := url.Parse(otlp)
		if err != nil {
			t.Fatalf("%s: %v", envJaegerOTLP, err)
		}
		grpcEndpoint = "http://" + u.Hostname() + ":4317"
	}
	for _, tc := range []struct{ protocol, endpoint string }{
		{"http/protobuf", otlp},
		{"grpc", grpcEndpoint},
	} {
		t.Run(strings.ReplaceAll(tc.protocol, "/", "_"), func(t *testing.T) {
			checkTraces(t, query, tc.protocol, tc.endpoint)
		})
	}
}

func checkTraces(t *testing.T, query, protocol, endpoint string) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	service := "onceflow-test-" + hex.EncodeToString(b[:])
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
	t.Setenv("OTEL_SERVICE_NAME", service)
	since := time.Now()

	s := startSeedServer(t)
	id := "7f8a0000-0000-0000-0000-0000000000e1"
	if code, _, body := s.post(id, order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	applied := s.audit(id, func(a map[string]any) bool { return len(processed(a)) == 4 })
	if code, _, body := s.do("POST", "/demo/replay-event/"+id, nil, ""); code != 200 {
		t.Fatalf("replay: %d %v", code, body)
	}
	s.drained()
	s.stop() // flushes the spans

	var traceIDs []string
	for _, p := range processed(applied) {
		traceIDs = append(traceIDs, p.(map[string]any)["trace_id"].(string))
	}
	applyTrace := traceIDs[0]
	if applyTrace == "" || slices.ContainsFunc(traceIDs, func(x string) bool { return x != applyTrace }) {
		t.Fatalf("processed_events trace ids = %v, want one batch's trace id for all four handlers", traceIDs)
	}

	var spans []otlpSpan
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans = jaegerSpans(t, query, service, since)
		if slices.ContainsFunc(spans, func(sp otlpSpan) bool { return sp.Name == "onceflow.batch" && len(sp.Events) > 0 }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger has no batch span with a dedup.skip event for %s after 30s (%d spans)", service, len(spans))
		}
		time.Sleep(200 * time.Millisecond)
	}
	tr := newTraceSpans(spans)
	batch := tr.checkApplyBatch(t, applyTrace)
	tr.checkReplaySkips(t, batch, id)
}

// traceSpans are the spans Jaeger holds for one test's service.
type traceSpans struct {
	spans []otlpSpan
	byID  map[string]otlpSpan
}

func newTraceSpans(spans []otlpSpan) *traceSpans {
	tr := &traceSpans{spans: spans, byID: map[string]otlpSpan{}}
	for _, sp := range spans {
		tr.byID[sp.SpanID] = sp
	}
	return tr
}

// children lists the names of parent's child spans.
func (tr *traceSpans) children(parent string) []string {
	var names []string
	for _, sp := range tr.spans {
		if sp.ParentSpanID == parent {
			names = append(names, sp.Name)
		}
	}
	return names
}

func describe(sp otlpSpan) string { return fmt.Sprintf("%s (%s/%s)", sp.Name, sp.TraceID, sp.SpanID) }

// checkApplyBatch checks the batch span of trace applyTrace, which applied
// the event: its children, and its link to the producer in the trace of
// the HTTP request. It returns the batch span.
func (tr *traceSpans) checkApplyBatch(t *testing.T, applyTrace string) otlpSpan {
	spans, byID, children := tr.spans, tr.byID, tr.children
	// The batch that applied the event.
	var batch otlpSpan
	for _, sp := range spans {
		if sp.Name == "onceflow.batch" && sp.TraceID == applyTrace {
			batch = sp
		}
	}
	if batch.SpanID == "" {
		t.Fatalf("no onceflow.batch span in trace %s (the trace id stored in processed_events)", applyTrace)
	}
	if batch.ParentSpanID != "" {
		t.Errorf("the batch span has a parent %s: producers must be links, not a false parent", batch.ParentSpanID)
	}
	got := children(batch.SpanID)
	for _, want := range []string{"dedup.claim", "handler emailHandler", "handler inventoryHandler",
		"handler analyticsHandler", "handler recommenderHandler", "sink.offset_cas", "sink.commit", "kafka.mark_offset"} {
		if !slices.Contains(got, want) {
			t.Errorf("batch span children %v lack %q", got, want)
		}
	}
	for _, sp := range spans {
		if sp.Name == "dedup.claim" && sp.ParentSpanID == batch.SpanID && len(children(sp.SpanID)) == 0 {
			t.Errorf("dedup.claim has no SQL span under it (pgx tracer)")
		}
	}
	// Its link leads to the producer's span, in the trace of the HTTP request.
	if len(batch.Links) == 0 {
		t.Fatalf("%s has no links to producer spans", describe(batch))
	}
	producer, ok := byID[batch.Links[0].SpanID]
	if !ok || !strings.HasSuffix(producer.Name, " publish") {
		t.Fatalf("the batch links to %v, want a kafka publish span", batch.Links[0])
	}
	root := producer
	for root.ParentSpanID != "" {
		parent, ok := byID[root.ParentSpanID]
		if !ok {
			break
		}
		root = parent
	}
	if root.Name != "POST /events-outbox/{bus}" {
		t.Errorf("the producer span's root is %s, want the ingest request POST /events-outbox/{bus}", describe(root))
	}
	return batch
}

// checkReplaySkips checks the replay's batch: another batch than the one
// that applied event id, linked to the replay's publish, with a dedup.skip
// event per handler naming the layer.
func (tr *traceSpans) checkReplaySkips(t *testing.T, batch otlpSpan, id string) {
	spans := tr.spans
	// The replay: another batch, linked to the replay's publish, with a
	// dedup.skip event per handler naming the layer.
	var skipped []string
	for _, sp := range spans {
		if sp.Name != "onceflow.batch" || sp.SpanID == batch.SpanID {
			continue
		}
		for _, ev := range sp.Events {
			attrs := map[string]string{}
			for _, a := range ev.Attributes {
				attrs[a.Key] = a.Value.StringValue
			}
			if ev.Name == "dedup.skip" && attrs["onceflow.event_id"] == id {
				if attrs["onceflow.layer"] != "lru" && attrs["onceflow.layer"] != "postgres" {
					t.Errorf("dedup.skip event layer = %q", attrs["onceflow.layer"])
				}
				skipped = append(skipped, attrs["onceflow.handler"])
			}
		}
		if len(skipped) > 0 && len(sp.Links) == 0 {
			t.Errorf("the replay's batch %s has no link to the replay's producer", describe(sp))
		}
	}
	slices.Sort(skipped)
	if strings.Join(skipped, ",") != "analyticsHandler,emailHandler,inventoryHandler,recommenderHandler" {
		t.Errorf("dedup.skip span events for the replay: %v, want one per handler", skipped)
	}
}
