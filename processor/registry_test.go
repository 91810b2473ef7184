package processor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/registry/registrytest"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// Two versions of the seed's order in Avro: v2 adds channel (with a
// default) and drops memo. The handlers read user_id and items from the
// JSON each record becomes, whichever version wrote it.
const (
	avroOrderV1 = `{"type":"record","name":"Order","namespace":"shop","fields":[
		{"name":"user_id","type":"long"},{"name":"items","type":{"type":"array","items":"string"}},{"name":"memo","type":"string"}]}`
	avroOrderV2 = `{"type":"record","name":"Order","namespace":"shop","fields":[
		{"name":"user_id","type":"long"},{"name":"items","type":{"type":"array","items":"string"}},
		{"name":"channel","type":"string","default":"web"}]}`
)

// eachRegistry runs f per registry (srfake, and the real one when
// ONCEFLOW_TEST_SCHEMA_REGISTRY is set).
func eachRegistry(t *testing.T, f func(t *testing.T, url string)) {
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) { f(t, url) })
	}
}

func registryDecoder(t *testing.T, url string) *registry.Decoder {
	t.Helper()
	d, err := registry.New(registry.Config{URL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// avroOrder encodes o with schema text and frames it with id.
func avroOrder(t *testing.T, text string, id int, o orders.Order, extra map[string]any) []byte {
	t.Helper()
	v := map[string]any{"user_id": o.UserID, "items": o.Items}
	for k, x := range extra {
		v[k] = x
	}
	b, err := avro.Marshal(avro.MustParse(text), v)
	if err != nil {
		t.Fatal(err)
	}
	return registrytest.Frame(t, id, nil, b)
}

// TestAvroOrdersThroughRegistry: orders written with v1 and v2 of one
// subject, in one topic, are each applied once; the poison — a value not
// framed, an unknown schema id, a truncated body — is one dead letter
// each, its reason naming the schema id (and the subject, once known).
func TestAvroOrdersThroughRegistry(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		eachRegistry(t, func(t *testing.T, url string) {
			e := newEnv(t, b, 2)
			subject := e.topic + "-value"
			id1 := registrytest.Register(t, url, subject, sr.Schema{Schema: avroOrderV1})
			id2 := registrytest.Register(t, url, subject, sr.Schema{Schema: avroOrderV2})
			stream, err := orders.Generate(200, 0, 7)
			if err != nil {
				t.Fatal(err)
			}
			var recs []*kgo.Record
			for i, m := range stream.Messages {
				o := stream.Unique[m.ID]
				v := avroOrder(t, avroOrderV1, id1, o, map[string]any{"memo": "v1"})
				if i%2 == 1 {
					v = avroOrder(t, avroOrderV2, id2, o, map[string]any{"channel": "app"})
				}
				recs = append(recs, wire.NewRecord(e.topic, m.ID, v))
			}
			good := avroOrder(t, avroOrderV2, id2, orders.Order{UserID: 1, Items: []string{"A"}}, map[string]any{"channel": "x"})
			poison := []struct {
				value  []byte
				reason string
			}{
				{[]byte(`{"user_id":1,"items":["A"]}`), "not framed for a schema registry"},
				{registrytest.Frame(t, 999999, nil, good[5:]), "schema id 999999: the schema registry does not know this schema id"},
				{good[:len(good)-2], fmt.Sprintf("schema id %d (subject ", id2)},
			}
			for i, p := range poison {
				recs = append(recs[:50*(i+1)], append([]*kgo.Record{wire.NewRecord(e.topic, uuid.New(), p.value)}, recs[50*(i+1):]...)...)
			}
			e.produce(recs...)
			cfg := e.config("avro")
			cfg.Decode = processor.DecodeConfig{Format: processor.FormatAvro, Registry: registryDecoder(t, url)}
			m := e.start(cfg, e.writer(1000))
			e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
			m.stop(t)
			e.checkExactlyOnce(stream.Unique)
			for _, p := range poison {
				if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE reason LIKE '%' || $1 || '%'`, p.reason); n != 1 {
					t.Errorf("dead_letters with reason containing %q: %d rows, want 1", p.reason, n)
				}
			}
			if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`); n != int64(len(poison)) {
				t.Errorf("%d dead letters, want %d", n, len(poison))
			}
		})
	})
}

const protoOrder = `syntax = "proto3";
package shop;
message Order {
  string event_id = 1;
  int32 user_id = 2; // int32: proto3's JSON mapping writes an int64 as a string
  repeated string items = 3;
}
`

// TestProtobufOrdersWithIDField: Protobuf orders carry their event id in a
// field (decode.event_id_source: field), read from the decoded message.
func TestProtobufOrdersWithIDField(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		eachRegistry(t, func(t *testing.T, url string) {
			e := newEnv(t, b, 1)
			id := registrytest.Register(t, url, e.topic+"-value", sr.Schema{Schema: protoOrder, Type: sr.TypeProtobuf})
			d := registryDecoder(t, url)
			stream, err := orders.Generate(100, 0, 9)
			if err != nil {
				t.Fatal(err)
			}
			md := compileOrder(t)
			var recs []*kgo.Record
			for _, m := range stream.Messages {
				o := stream.Unique[m.ID]
				j, _ := json.Marshal(map[string]any{"event_id": m.ID.String(), "user_id": o.UserID, "items": o.Items})
				pm := dynamicpb.NewMessage(md)
				if err := protojson.Unmarshal(j, pm); err != nil {
					t.Fatal(err)
				}
				body, err := proto.Marshal(pm)
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, &kgo.Record{Topic: e.topic, Value: registrytest.Frame(t, id, []int{0}, body)})
			}
			e.produce(recs...)
			cfg := e.config("protobuf")
			cfg.Decode = processor.DecodeConfig{Format: processor.FormatProtobuf, Registry: d, IDSource: processor.IDFromField, IDField: "event_id"}
			m := e.start(cfg, e.writer(1000))
			e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
			m.stop(t)
			e.checkExactlyOnce(stream.Unique)
		})
	})
}

// TestAvroOrdersWithIDField: Avro orders carry their event id in a field
// of logical type uuid (decode.event_id_source: field), read from the
// decoded record; the records have no event_id header, and redeliveries
// apply once.
func TestAvroOrdersWithIDField(t *testing.T) {
	const schema = `{"type":"record","name":"Order","namespace":"shop","fields":[
		{"name":"event_id","type":{"type":"string","logicalType":"uuid"}},
		{"name":"user_id","type":"long"},{"name":"items","type":{"type":"array","items":"string"}}]}`
	eachBroker(t, func(t *testing.T, b broker) {
		eachRegistry(t, func(t *testing.T, url string) {
			e := newEnv(t, b, 1)
			id := registrytest.Register(t, url, e.topic+"-value", sr.Schema{Schema: schema})
			stream, err := orders.Generate(100, 0.3, 11)
			if err != nil {
				t.Fatal(err)
			}
			var recs []*kgo.Record
			for _, m := range stream.Messages {
				v := avroOrder(t, schema, id, stream.Unique[m.ID], map[string]any{"event_id": m.ID.String()})
				recs = append(recs, &kgo.Record{Topic: e.topic, Value: v})
			}
			e.produce(recs...)
			cfg := e.config("avro")
			cfg.Decode = processor.DecodeConfig{Format: processor.FormatAvro, Registry: registryDecoder(t, url),
				IDSource: processor.IDFromField, IDField: "event_id"}
			m := e.start(cfg, e.writer(1000))
			e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
			m.stop(t)
			e.checkExactlyOnce(stream.Unique)
		})
	})
}

// TestRegistryDownRetriesNeverDeadLetters: while the registry answers 503
// or cannot be reached, the partition retries and nothing becomes a dead
// letter; once it is back, every record applies.
func TestRegistryDownRetriesNeverDeadLetters(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		fake := srfake.New()
		defer fake.Close()
		id, _, err := fake.RegisterSchema(e.topic+"-value", sr.Schema{Schema: avroOrderV2})
		if err != nil {
			t.Fatal(err)
		}
		var down atomic.Bool
		var refused atomic.Int64
		down.Store(true)
		fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if down.Load() {
				refused.Add(1)
				http.Error(w, `{"error_code":50301,"message":"restarting"}`, http.StatusServiceUnavailable)
				return true
			}
			return false
		})
		stream, err := orders.Generate(50, 0, 11)
		if err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		for _, m := range stream.Messages {
			recs = append(recs, wire.NewRecord(e.topic, m.ID, avroOrder(t, avroOrderV2, id, stream.Unique[m.ID], map[string]any{"channel": "web"})))
		}
		e.produce(recs...)
		cfg := e.config("registry-down")
		cfg.Decode = processor.DecodeConfig{Format: processor.FormatAvro, Registry: registryDecoder(t, fake.URL())}
		m := e.start(cfg, e.writer(1000))
		for refused.Load() < 3 { // the worker asked, failed, and asked again after its backoff
			time.Sleep(20 * time.Millisecond)
		}
		if n := e.processed(); n != 0 {
			t.Errorf("%d events processed while the registry was down, want 0", n)
		}
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`); n != 0 {
			t.Errorf("%d dead letters while the registry was down, want 0", n)
		}
		if s := m.c.Stats(); s.Retries == 0 {
			t.Errorf("Stats.Retries = 0 while the registry was down")
		}
		down.Store(false)
		e.waitProcessed(int64(len(stream.Unique)), 60*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`); n != 0 {
			t.Errorf("%d dead letters, want 0", n)
		}
	})
}

// TestRegistryRefusingCredentialsEndsRun: a 401 ends Run with an error
// registry.IsAuth recognizes; nothing is applied or dead-lettered.
func TestRegistryRefusingCredentialsEndsRun(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		fake := srfake.New()
		defer fake.Close()
		fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			http.Error(w, `{"error_code":40101,"message":"unauthorized"}`, http.StatusUnauthorized)
			return true
		})
		e.produce(wire.NewRecord(e.topic, uuid.New(), registrytest.Frame(t, 1, nil, []byte{2, 'A'})))
		cfg := e.config("registry-401")
		cfg.Decode = processor.DecodeConfig{Format: processor.FormatAvro, Registry: registryDecoder(t, fake.URL())}
		c, err := processor.New(cfg, e.writer(1000))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		err = c.Run(ctx)
		if !registry.IsAuth(err) {
			t.Fatalf("Run: %v, want an error registry.IsAuth recognizes", err)
		}
		if ctx.Err() != nil {
			t.Fatalf("Run returned only when its context ended: %v", err)
		}
		if n := e.processed(); n != 0 {
			t.Errorf("%d events processed, want 0", n)
		}
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`); n != 0 {
			t.Errorf("%d dead letters, want 0", n)
		}
		var de *processor.DecodeError
		if errors.As(err, &de) {
			t.Errorf("a refused credential is a DecodeError: %v", err)
		}
	})
}

func TestDecodeConfigFramedNeedsRegistry(t *testing.T) {
	for _, f := range []processor.Format{processor.FormatAvro, processor.FormatProtobuf} {
		err := processor.DecodeConfig{Format: f}.Validate()
		if err == nil || !strings.Contains(err.Error(), "Decode.Registry is required with Format "+string(f)) {
			t.Errorf("Format %s without a Registry: got %v, want a problem naming Decode.Registry", f, err)
		}
		d, _ := registry.New(registry.Config{URL: "http://127.0.0.1:1"})
		if err := (processor.DecodeConfig{Format: f, Registry: d, IDSource: processor.IDFromField, IDField: "id"}).Validate(); err != nil {
			t.Errorf("Format %s with a Registry and IDFromField: %v", f, err)
		}
	}
	if err := (processor.DecodeConfig{Format: "xml"}).Validate(); err == nil || !strings.Contains(err.Error(), "avro") {
		t.Errorf("unknown format: %v, want the list of formats", err)
	}
}

// FormatJSON takes a value framed by a JSON Schema serializer (magic byte,
// schema id, then the JSON) as the JSON it carries.
func TestDecodeFramedJSON(t *testing.T) {
	id := uuid.New()
	for _, c := range []struct {
		name   string
		value  []byte
		want   string // the event's value; "" for a dead letter
		reason string
	}{
		{"plain", []byte(`{"a":1}`), `{"a":1}`, ""},
		{"framed", append([]byte{0, 0, 0, 0, 7}, `{"a":1}`...), `{"a":1}`, ""},
		{"framed, not JSON", append([]byte{0, 0, 0, 0, 7}, `{"a":`...), "", "not valid JSON"},
		{"header alone", []byte{0, 0, 0, 0, 7}, "", "NUL byte"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev, err := processor.Decode(wire.NewRecord("t", id, c.value), processor.DecodeConfig{})
			if c.want == "" {
				var de *processor.DecodeError
				if !errors.As(err, &de) || !strings.Contains(de.Reason, c.reason) {
					t.Fatalf("got %v, want a DecodeError with %q", err, c.reason)
				}
				return
			}
			if err != nil || string(ev.Value) != c.want {
				t.Fatalf("got %q, %v; want %s", ev.Value, err, c.want)
			}
		})
	}
}
