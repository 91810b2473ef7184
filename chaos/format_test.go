package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/registry"
)

func TestResolveFormat(t *testing.T) {
	for _, c := range []struct {
		flag string
		seed uint64
		want string
	}{
		{"seed", 28, formatJSON}, {"seed", 1648335418224000, formatJSON}, {"seed", 6188283686042936, formatJSON},
		{"seed", 29, formatAvro}, {"seed", 31, formatProtobuf}, {"json", 29, formatJSON}, {"avro", 28, formatAvro},
		{"protobuf", 28, formatProtobuf},
	} {
		got, err := resolveFormat(c.flag, c.seed)
		if err != nil || got != c.want {
			t.Errorf("resolveFormat(%q, %d) = %q, %v; want %q", c.flag, c.seed, got, err, c.want)
		}
	}
	if _, err := resolveFormat("bytes", 1); err == nil {
		t.Error("resolveFormat(bytes) took a format chaos does not run")
	}
}

// TestAvroWorkload reads an Avro or Protobuf run's records as a member does: every
// good record decodes to its order, every poison record is refused by the
// decoder (a DataError naming the schema id where the value names one) or
// by the handlers, and the oversize poison stays over the decoder's limit.
func TestAvroWorkload(t *testing.T) {
	for _, kind := range []registry.Kind{registry.Avro, registry.Protobuf} {
		t.Run(string(kind), func(t *testing.T) { testFramedWorkload(t, kind) })
	}
}

func testFramedWorkload(t *testing.T, kind registry.Kind) {
	fake := srfake.New()
	t.Cleanup(fake.Close)
	w := testWorkload(t, 7)
	const maxRecord = 1 << 20
	a, err := setupAvro(t.Context(), &chaosRegistry{url: fake.URL()}, kind, "chaos-orders-t", w, maxRecord)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := registry.New(registry.Config{URL: fake.URL(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	seen := map[string]int{}
	for _, recs := range [][]record{w.Records, w.Burst} {
		for _, r := range recs {
			seen[r.Kind]++
			v, err := dec.Decode(t.Context(), kind, r.Value)
			var de *registry.DataError
			switch r.Kind {
			case kindOrder, kindRedelivery:
				if err != nil {
					t.Fatalf("seq %d (%s): %v", r.Seq, r.Kind, err)
				}
				o, err := orders.Parse(v)
				if err != nil || !slices.Equal(o.Items, w.Orders[r.ID].Items) || o.UserID != w.Orders[r.ID].UserID {
					t.Fatalf("seq %d: decoded %s (%v), want %+v", r.Seq, v, err, w.Orders[r.ID])
				}
			case avroUnknownID, avroTruncated, avroCorrupt, avroNotFramed, "empty", "nul", "nul-escape":
				if !errors.As(err, &de) {
					t.Fatalf("seq %d (%s): decoded %q, %v; want a dead letter's DataError", r.Seq, r.Kind, v, err)
				}
				if r.Kind == avroTruncated || r.Kind == avroCorrupt || r.Kind == avroUnknownID {
					if !strings.HasPrefix(de.Error(), "schema id ") || de.SchemaID == 0 {
						t.Errorf("seq %d (%s): reason %q names no schema id", r.Seq, r.Kind, de.Error())
					}
				}
				if r.Kind == avroTruncated && de.SchemaID != a.enc.ID() {
					t.Errorf("seq %d: schema id %d, want %d", r.Seq, de.SchemaID, a.enc.ID())
				}
			case "rejected", "data-error", kindBurst:
				if err != nil {
					t.Fatalf("seq %d (%s): %v; the handlers should be the ones to refuse it", r.Seq, r.Kind, err)
				}
				if r.Kind == "rejected" {
					if _, err := orders.Parse(v); err == nil {
						t.Errorf("seq %d: rejected poison %s parses as an order", r.Seq, v)
					}
				}
			case "over-decoder":
				if len(r.Value) <= maxRecord {
					t.Errorf("seq %d: over-decoder poison of %d bytes, not over %d", r.Seq, len(r.Value), maxRecord)
				}
			case "no-id", "bad-id", "over-dlq":
				if err != nil {
					t.Fatalf("seq %d (%s): %v", r.Seq, r.Kind, err)
				}
			default:
				t.Fatalf("seq %d: kind %q not checked", r.Seq, r.Kind)
			}
		}
	}
	for _, k := range append(slices.Clone(avroPoison), "bad-json") {
		if want := k != "bad-json"; (seen[k] > 0) != want {
			t.Errorf("%d records of kind %s", seen[k], k)
		}
	}
}

// formatFailures holds each framed poison's dead letter to the reason the
// decoder must give, and fails a dead letter the registry being down made.
func TestFormatFailures(t *testing.T) {
	fake := srfake.New()
	t.Cleanup(fake.Close)
	w := &workload{Records: []record{{Seq: 1, Kind: "bad-json", Value: []byte("x")}}}
	a, err := setupAvro(t.Context(), &chaosRegistry{url: fake.URL()}, registry.Avro, "chaos-orders-t", w, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	unknown := &w.Records[0] // the first bad-json is an unknown id
	truncated := &record{Kind: avroTruncated}
	at := func(o int64) pos { return pos{Partition: 0, Offset: o} }
	e := &expectation{Poison: map[pos]*record{at(1): unknown, at(2): truncated}}
	good := fmt.Sprintf("schema id %d (subject chaos-orders-t-value): the body is truncated", a.enc.ID())
	idReason := fmt.Sprintf("schema id %d: the schema registry does not know this schema id", unknownSchemaID)
	for _, c := range []struct {
		name string
		dl   map[pos]deadLetter
		want int
	}{
		{"reasons as the decoder gives them", map[pos]deadLetter{at(1): {Count: 1, Reason: idReason}, at(2): {Count: 1, Reason: good}}, 0},
		{"the unknown id not named", map[pos]deadLetter{at(1): {Count: 1, Reason: "value is not framed"}, at(2): {Count: 1, Reason: good}}, 1},
		{"a dead letter of a registry that was down", map[pos]deadLetter{at(1): {Count: 1, Reason: idReason}, at(2): {Count: 1, Reason: good},
			at(3): {Count: 1, Reason: "schema registry unreachable: dial tcp: connection refused"}}, 1},
	} {
		got := formatFailures(a, e, &observed{DeadLetters: c.dl})
		if len(got) != c.want {
			t.Errorf("%s: %d failures %q, want %d", c.name, len(got), got, c.want)
		}
	}
	if got := formatFailures(nil, e, &observed{}); got != nil {
		t.Errorf("a JSON run: %q", got)
	}
}
