package registry_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/registry/registrytest"
)

var seq atomic.Int64

// subject is a subject no other test or run uses, for the shared real
// registry.
func subject(t *testing.T) string {
	return fmt.Sprintf("%s-%d-%d-value", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano(), seq.Add(1))
}

func decoder(t *testing.T, url string) *registry.Decoder {
	t.Helper()
	d, err := registry.New(registry.Config{URL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// fields decodes a JSON object into its fields, raw.
func fields(t *testing.T, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decoded value is not a JSON object: %v: %s", err, b)
	}
	return m
}

// compact returns s as compact JSON, to compare field by field.
func compact(t *testing.T, s []byte) string {
	t.Helper()
	var v any
	d := json.NewDecoder(strings.NewReader(string(s)))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not JSON: %s", s)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

const avroOrder = `{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":{"type":"string","logicalType":"uuid"}},
 {"name":"active","type":"boolean"},
 {"name":"qty","type":"int"},
 {"name":"big","type":"long"},
 {"name":"ratio","type":"float"},
 {"name":"score","type":"double"},
 {"name":"note","type":"string"},
 {"name":"raw","type":"bytes"},
 {"name":"nothing","type":"null"},
 {"name":"maybe","type":["null","string"]},
 {"name":"maybe_not","type":["null","string"]},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
 {"name":"tag","type":{"type":"fixed","name":"Tag","size":2}},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[{"name":"sku","type":"string"},{"name":"n","type":"int"}]}}},
 {"name":"attrs","type":{"type":"map","values":"long"}},
 {"name":"either","type":["null","long","Item"]},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
 {"name":"refund","type":{"type":"fixed","name":"Money","size":4,"logicalType":"decimal","precision":9,"scale":2}},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"at_ms","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"at_us","type":{"type":"long","logicalType":"timestamp-micros"}},
 {"name":"local_ms","type":{"type":"long","logicalType":"local-timestamp-millis"}},
 {"name":"tod_ms","type":{"type":"int","logicalType":"time-millis"}},
 {"name":"tod_us","type":{"type":"long","logicalType":"time-micros"}},
 {"name":"period","type":{"type":"fixed","name":"Period","size":12,"logicalType":"duration"}}
]}`

// sampleAvroOrder is a value of avroOrder with every field set.
func sampleAvroOrder() map[string]any {
	at := time.Date(2026, 1, 31, 12, 30, 45, 123456000, time.UTC)
	return map[string]any{
		"id": "6f1c8a4e-2b7d-4c1e-9a0f-3d5b7e9c1a2b", "active": true, "qty": 3, "big": int64(9007199254740993),
		"ratio": float32(0.5), "score": 2.25, "note": "tab\there \"q\" é", "raw": []byte{0, 1, 0xff}, "nothing": nil,
		"maybe": "yes", "maybe_not": nil, "either": map[string]any{"shop.Item": map[string]any{"sku": "x", "n": 1}},
		"status": "PAID", "tag": [2]byte{0xab, 0xcd},
		"items":  []any{map[string]any{"sku": "a", "n": 1}, map[string]any{"sku": "b", "n": 2}},
		"attrs":  map[string]any{"k": int64(7)},
		"amount": big.NewRat(-12345, 100), "refund": big.NewRat(5, 100),
		"day": time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC), "at_ms": at, "at_us": at, "local_ms": at,
		"tod_ms": 3*time.Hour + 4*time.Minute + 5*time.Second + 6*time.Millisecond,
		"tod_us": 3*time.Hour + 4*time.Minute + 5*time.Second + 6007*time.Microsecond,
		"period": avro.LogicalDuration{Months: 1, Days: 2, Milliseconds: 3},
	}
}

// TestAvroMapping checks the table of docs/sql-handlers.md field by
// field: a record written by hamba/avro's encoder, read back by the
// registry's decoder, on srfake and on the real registry.
func TestAvroMapping(t *testing.T) {
	value := sampleAvroOrder()
	want := map[string]string{
		"id": `"6f1c8a4e-2b7d-4c1e-9a0f-3d5b7e9c1a2b"`, "active": `true`, "qty": `3`, "big": `9007199254740993`,
		"ratio": `0.5`, "score": `2.25`, "note": `"tab\there \"q\" é"`, "raw": `"AAH/"`, "nothing": `null`,
		"maybe": `"yes"`, "maybe_not": `null`, "either": `{"n":1,"sku":"x"}`,
		"status": `"PAID"`, "tag": `"q80="`,
		"items": `[{"n":1,"sku":"a"},{"n":2,"sku":"b"}]`, "attrs": `{"k":7}`,
		"amount": `-123.45`, "refund": `0.05`,
		"day": `"2026-01-31"`, "at_ms": `"2026-01-31T12:30:45.123Z"`, "at_us": `"2026-01-31T12:30:45.123456Z"`,
		"local_ms": `"2026-01-31T12:30:45.123"`, "tod_ms": `"03:04:05.006"`, "tod_us": `"03:04:05.006007"`,
		"period": `{"days":2,"milliseconds":3,"months":1}`,
	}
	sch := avro.MustParse(avroOrder)
	body, err := avro.Marshal(sch, value)
	if err != nil {
		t.Fatal(err)
	}
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			id := registrytest.Register(t, url, subject(t), sr.Schema{Schema: avroOrder, Type: sr.TypeAvro})
			got, err := decoder(t, url).Decode(t.Context(), registry.Avro, registrytest.Frame(t, id, nil, body))
			if err != nil {
				t.Fatal(err)
			}
			f := fields(t, got)
			if len(f) != len(want) {
				t.Errorf("got %d fields, want %d: %s", len(f), len(want), got)
			}
			for k, w := range want {
				if g, ok := f[k]; !ok {
					t.Errorf("%s: missing", k)
				} else if compact(t, g) != compact(t, []byte(w)) {
					t.Errorf("%s: got %s, want %s", k, g, w)
				}
			}
		})
	}
}

const protoOrder = `syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";

message Header { string trace = 1; }
message Order {
  enum Status { NEW = 0; PAID = 1; }
  message Item { string sku = 1; int32 n = 2; }
  string id = 1;
  int32 qty = 2;
  int64 cents = 3;
  uint64 big = 4;
  double score = 5;
  bool active = 6;
  bytes raw = 7;
  Status status = 8;
  repeated Item items = 9;
  map<string, int64> attrs = 10;
  google.protobuf.Timestamp at = 11;
  google.protobuf.Duration took = 12;
  google.protobuf.StringValue maybe = 13;
  google.protobuf.Struct extra = 14;
  Item unset = 15;
  oneof pay { string card = 16; string iban = 17; }
  float ratio = 18;
  string empty = 19;
}
`

// TestProtobufMapping checks the Protobuf rows of the table: proto3's JSON
// mapping with .proto names and every field present, for the second
// message of the file (message index [1]) and a nested one.
func TestProtobufMapping(t *testing.T) {
	input := `{"id":"o-1","qty":3,"cents":"-1999","big":"18446744073709551615","score":2.5,"active":true,"raw":"AAH/",
	 "status":"PAID","items":[{"sku":"a","n":1}],"attrs":{"k":"7"},"at":"2026-01-31T12:30:45.123456Z","took":"1.500s",
	 "maybe":"yes","extra":{"a":[1,"b",null]},"card":"4111","ratio":0.5}`
	want := map[string]string{
		"id": `"o-1"`, "qty": `3`, "cents": `"-1999"`, "big": `"18446744073709551615"`, "score": `2.5`, "active": `true`,
		"raw": `"AAH/"`, "status": `"PAID"`, "items": `[{"sku":"a","n":1}]`, "attrs": `{"k":"7"}`,
		"at": `"2026-01-31T12:30:45.123456Z"`, "took": `"1.500s"`, "maybe": `"yes"`, "extra": `{"a":[1,"b",null]}`,
		"unset": `null`, "card": `"4111"`, "ratio": `0.5`, "empty": `""`,
	}
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			id := registrytest.Register(t, url, subject(t), sr.Schema{Schema: protoOrder, Type: sr.TypeProtobuf})
			d := decoder(t, url)
			md := compileMessage(t, "shop.Order")
			m := dynamicpb.NewMessage(md)
			if err := protojson.Unmarshal([]byte(input), m); err != nil {
				t.Fatal(err)
			}
			body, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.Decode(t.Context(), registry.Protobuf, registrytest.Frame(t, id, []int{1}, body))
			if err != nil {
				t.Fatal(err)
			}
			// One form whatever the build (protojson's whitespace varies):
			// the payload digest of a redelivery must not change.
			var c bytes.Buffer
			if err := json.Compact(&c, got); err != nil || !bytes.Equal(c.Bytes(), got) {
				t.Errorf("the payload is not in compact form: %s", got)
			}
			f := fields(t, got)
			if len(f) != len(want) {
				t.Errorf("got %d fields, want %d: %s", len(f), len(want), got)
			}
			for k, w := range want {
				if g, ok := f[k]; !ok {
					t.Errorf("%s: missing", k)
				} else if compact(t, g) != compact(t, []byte(w)) {
					t.Errorf("%s: got %s, want %s", k, g, w)
				}
			}
			// Order.Item, nested: index [1, 0].
			item := dynamicpb.NewMessage(md.Messages().ByName("Item"))
			if err := protojson.Unmarshal([]byte(`{"sku":"z","n":9}`), item); err != nil {
				t.Fatal(err)
			}
			body, _ = proto.Marshal(item)
			got, err = d.Decode(t.Context(), registry.Protobuf, registrytest.Frame(t, id, []int{1, 0}, body))
			if err != nil {
				t.Fatal(err)
			}
			if g, w := compact(t, got), `{"n":9,"sku":"z"}`; g != w {
				t.Errorf("nested Item: got %s, want %s", g, w)
			}
		})
	}
}

// TestEvolution: v1 and v2 of one subject (v2 adds a field with a default
// and removes one) decode each by its own writer schema: each record
// carries the fields it was written with.
func TestEvolution(t *testing.T) {
	v1 := `{"type":"record","name":"Payment","fields":[{"name":"id","type":"string"},{"name":"cents","type":"long"},{"name":"memo","type":"string"}]}`
	v2 := `{"type":"record","name":"Payment","fields":[{"name":"id","type":"string"},{"name":"cents","type":"long"},{"name":"currency","type":"string","default":"EUR"}]}`
	b1, err := avro.Marshal(avro.MustParse(v1), map[string]any{"id": "p1", "cents": int64(100), "memo": "first"})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := avro.Marshal(avro.MustParse(v2), map[string]any{"id": "p2", "cents": int64(200), "currency": "USD"})
	if err != nil {
		t.Fatal(err)
	}
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			s := subject(t)
			id1 := registrytest.Register(t, url, s, sr.Schema{Schema: v1})
			id2 := registrytest.Register(t, url, s, sr.Schema{Schema: v2})
			if id1 == id2 {
				t.Fatalf("v1 and v2 got one id %d", id1)
			}
			d := decoder(t, url)
			for _, c := range []struct {
				id   int
				body []byte
				want string
			}{
				{id1, b1, `{"cents":100,"id":"p1","memo":"first"}`},
				{id2, b2, `{"cents":200,"currency":"USD","id":"p2"}`},
			} {
				got, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, c.id, nil, c.body))
				if err != nil {
					t.Fatalf("schema id %d: %v", c.id, err)
				}
				if g := compact(t, got); g != c.want {
					t.Errorf("schema id %d: got %s, want %s", c.id, g, c.want)
				}
			}
		})
	}
}

// TestDataErrors: values no registry answer can fix are *DataError naming
// the schema id, and the subject when the registry knows the id.
func TestDataErrors(t *testing.T) {
	payment := `{"type":"record","name":"Payment","fields":[{"name":"id","type":"string"},{"name":"cents","type":"long"}]}`
	good, _ := avro.Marshal(avro.MustParse(payment), map[string]any{"id": "p1", "cents": int64(100)})
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			s := subject(t)
			id := registrytest.Register(t, url, s, sr.Schema{Schema: payment})
			pid := registrytest.Register(t, url, subject(t), sr.Schema{Schema: protoOrder, Type: sr.TypeProtobuf})
			uid := registrytest.Register(t, url, subject(t), sr.Schema{Schema: `["null","string"]`})
			eid := registrytest.Register(t, url, subject(t), sr.Schema{Schema: `{"type":"enum","name":"S","symbols":["A","B"]}`})
			d := decoder(t, url)
			for _, c := range []struct {
				name    string
				kind    registry.Kind
				value   []byte
				id      int
				subject string
				reason  string
			}{
				{"not framed: JSON", registry.Avro, []byte(`{"id":"p1"}`), 0, "", "first byte is 0x7b"},
				{"not framed: short", registry.Avro, []byte{0, 0, 1}, 0, "", "too short"},
				{"empty", registry.Avro, nil, 0, "", "value is empty"},
				{"unknown schema id", registry.Avro, registrytest.Frame(t, 987654, nil, good), 987654, "", "does not know this schema id"},
				{"truncated", registry.Avro, registrytest.Frame(t, id, nil, good[:len(good)-1]), id, s, "truncated"},
				{"bad union branch", registry.Avro, registrytest.Frame(t, uid, nil, []byte{0x08}), uid, s, "union branch 4"},
				{"bad enum symbol", registry.Avro, registrytest.Frame(t, eid, nil, []byte{0x06}), eid, s, "index 3"},
				{"trailing bytes", registry.Avro, registrytest.Frame(t, id, nil, append(append([]byte{}, good...), 1, 2)), id, s, "2 bytes left"},
				{"corrupt length", registry.Avro, registrytest.Frame(t, id, nil, []byte{0x7e, 'a'}), id, s, "truncated"},
				{"wrong kind", registry.Protobuf, registrytest.Frame(t, id, []int{0}, good), id, s, "the schema is AVRO, not protobuf"},
				{"no such message", registry.Protobuf, registrytest.Frame(t, pid, []int{5}, nil), pid, "", "no message 5"},
				{"corrupt protobuf", registry.Protobuf, registrytest.Frame(t, pid, []int{1}, []byte{0x0a, 0x05, 'a'}), pid, "", "not a valid shop.Order"},
			} {
				t.Run(c.name, func(t *testing.T) {
					_, err := d.Decode(t.Context(), c.kind, c.value)
					var de *registry.DataError
					if !errors.As(err, &de) {
						t.Fatalf("got %v (%T), want a *registry.DataError", err, err)
					}
					// A registry gives one id to one schema text whatever
					// the subject (the real one does across tests), so the
					// subject named is one that uses the id.
					if de.SchemaID != c.id || (c.subject != "" && de.Subject == "") || !strings.Contains(de.Reason, c.reason) {
						t.Errorf("got id %d subject %q reason %q; want id %d subject %q, reason containing %q", de.SchemaID, de.Subject, de.Reason, c.id, c.subject, c.reason)
					}
					if c.id != 0 && !strings.Contains(err.Error(), fmt.Sprintf("schema id %d", c.id)) {
						t.Errorf("error %q does not name schema id %d", err, c.id)
					}
					if registry.IsTransient(err) || registry.IsAuth(err) {
						t.Errorf("a data error is classified transient or auth: %v", err)
					}
				})
			}
		})
	}
}

// TestRegistryErrors: a registry that is down or failing is transient, one
// refusing the credentials is auth; neither is a data error, and a
// transient failure is not cached: the next call succeeds once the
// registry does.
func TestRegistryErrors(t *testing.T) {
	payment := `{"type":"record","name":"Payment","fields":[{"name":"id","type":"string"}]}`
	body, _ := avro.Marshal(avro.MustParse(payment), map[string]any{"id": "p1"})

	t.Run("5xx then healthy", func(t *testing.T) {
		fake := srfake.New()
		defer fake.Close()
		id, _, err := fake.RegisterSchema("p-value", sr.Schema{Schema: payment})
		if err != nil {
			t.Fatal(err)
		}
		var failing atomic.Bool
		failing.Store(true)
		fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if failing.Load() {
				http.Error(w, `{"error_code":50001,"message":"storage down"}`, http.StatusInternalServerError)
				return true
			}
			return false
		})
		d := decoder(t, fake.URL())
		v := registrytest.Frame(t, id, nil, body)
		_, err = d.Decode(t.Context(), registry.Avro, v)
		if !registry.IsTransient(err) || registry.IsAuth(err) {
			t.Fatalf("got %v, want a transient error", err)
		}
		var de *registry.DataError
		if errors.As(err, &de) {
			t.Fatalf("a 5xx is a data error: %v", err)
		}
		failing.Store(false)
		got, err := d.Decode(t.Context(), registry.Avro, v)
		if err != nil || compact(t, got) != `{"id":"p1"}` {
			t.Fatalf("after the registry recovered: got %s, %v", got, err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		fake := srfake.New()
		url := fake.URL()
		fake.Close()
		d := decoder(t, url)
		_, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, 1, nil, body))
		if !registry.IsTransient(err) {
			t.Fatalf("got %v, want a transient error", err)
		}
		if err := d.Check(t.Context()); !registry.IsTransient(err) {
			t.Fatalf("Check: got %v, want a transient error", err)
		}
	})
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			fake := srfake.New()
			defer fake.Close()
			fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
				http.Error(w, `{"error_code":`+fmt.Sprint(status)+`01,"message":"no"}`, status)
				return true
			})
			d := decoder(t, fake.URL())
			_, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, 1, nil, body))
			if !registry.IsAuth(err) || registry.IsTransient(err) {
				t.Fatalf("Decode: got %v, want an auth error", err)
			}
			if err := d.Check(t.Context()); !registry.IsAuth(err) {
				t.Fatalf("Check: got %v, want an auth error", err)
			}
		})
	}
	t.Run("basic auth accepted", func(t *testing.T) {
		fake := srfake.New(srfake.WithAuth("Basic dTpw")) // u:p
		defer fake.Close()
		d, err := registry.New(registry.Config{URL: fake.URL(), Username: "u", Password: "p"})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Check(t.Context()); err != nil {
			t.Fatalf("Check with the right credentials: %v", err)
		}
		bad, _ := registry.New(registry.Config{URL: fake.URL(), Username: "u", Password: "wrong"})
		if err := bad.Check(t.Context()); !registry.IsAuth(err) {
			t.Fatalf("Check with a wrong password: got %v, want an auth error", err)
		}
	})
	t.Run("tls", func(t *testing.T) {
		fake := srfake.New()
		defer fake.Close()
		id, _, err := fake.RegisterSchema("p-value", sr.Schema{Schema: payment})
		if err != nil {
			t.Fatal(err)
		}
		target, _ := url.Parse(fake.URL())
		srv := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(target))
		defer srv.Close()
		roots := x509.NewCertPool()
		roots.AddCert(srv.Certificate())
		d, err := registry.New(registry.Config{URL: srv.URL, TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := d.Check(t.Context()); err != nil {
			t.Fatalf("Check over TLS with the server's CA: %v", err)
		}
		if got, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, id, nil, body)); err != nil || compact(t, got) != `{"id":"p1"}` {
			t.Fatalf("Decode over TLS: %s, %v", got, err)
		}
		// A certificate the client does not trust is configuration, which
		// no retry fixes: Check fails the start instead of waiting.
		untrusted := decoder(t, srv.URL)
		err = untrusted.Check(t.Context())
		if err == nil || registry.IsTransient(err) {
			t.Fatalf("Check with a certificate signed by an unknown authority: got %v, want a configuration error", err)
		}
		// Nor is an https URL of a server speaking plain HTTP.
		plain := decoder(t, strings.Replace(fake.URL(), "http://", "https://", 1))
		if err := plain.Check(t.Context()); err == nil || registry.IsTransient(err) {
			t.Fatalf("Check of https on a plain HTTP server: got %v, want a configuration error", err)
		}
	})
	t.Run("not the API", func(t *testing.T) {
		fake := srfake.New()
		defer fake.Close()
		d := decoder(t, fake.URL()+"/not/here")
		if err := d.Check(t.Context()); err == nil || registry.IsTransient(err) || registry.IsAuth(err) {
			t.Fatalf("Check on a wrong path: got %v, want a configuration error", err)
		}
		_, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, 1, nil, body))
		var de *registry.DataError
		if errors.As(err, &de) {
			t.Fatalf("a 404 without error code 40403 dead-letters: %v", err)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	err := registry.Config{URL: "ftp://x", Password: "p", Timeout: -1, CacheSize: -1}.Validate()
	for _, w := range []string{"URL", "Password", "Timeout", "CacheSize"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: %v, want a problem naming %s", err, w)
		}
	}
	if err := (registry.Config{URL: "http://127.0.0.1:1"}).Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// compileMessage compiles protoOrder locally (as a producer would) and
// returns the named message.
func compileMessage(t *testing.T, name string) protoreflectMessageDescriptor {
	t.Helper()
	return compileProto(t, protoOrder, name)
}

var _ = context.Background

// Schemas that refer to others (Confluent's references): an Avro record
// using a type of another subject, a .proto importing another file.
func TestReferences(t *testing.T) {
	money := `{"type":"record","name":"Money","namespace":"shop","fields":[{"name":"cents","type":"long"},{"name":"currency","type":"string"}]}`
	payment := `{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"total","type":"shop.Money"}]}`
	common := "syntax = \"proto3\";\npackage shop;\nmessage Money { int32 cents = 1; string currency = 2; }\n"
	order := "syntax = \"proto3\";\npackage shop;\nimport \"shop/money.proto\";\nmessage Order { string id = 1; Money total = 2; }\n"
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			d := decoder(t, url)
			ms := subject(t)
			registrytest.Register(t, url, ms, sr.Schema{Schema: money})
			id := registrytest.Register(t, url, subject(t), sr.Schema{Schema: payment,
				References: []sr.SchemaReference{{Name: "shop.Money", Subject: ms, Version: 1}}})
			full := avro.MustParse(`{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"total","type":` + money + `}]}`)
			body, err := avro.Marshal(full, map[string]any{"id": "p1", "total": map[string]any{"cents": int64(1250), "currency": "EUR"}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, id, nil, body))
			if err != nil {
				t.Fatal(err)
			}
			if g, w := compact(t, got), `{"id":"p1","total":{"cents":1250,"currency":"EUR"}}`; g != w {
				t.Errorf("avro with a reference: got %s, want %s", g, w)
			}

			cs := subject(t)
			registrytest.Register(t, url, cs, sr.Schema{Schema: common, Type: sr.TypeProtobuf})
			pid := registrytest.Register(t, url, subject(t), sr.Schema{Schema: order, Type: sr.TypeProtobuf,
				References: []sr.SchemaReference{{Name: "shop/money.proto", Subject: cs, Version: 1}}})
			c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
				Accessor: protocompile.SourceAccessorFromMap(map[string]string{"order.proto": order, "shop/money.proto": common})})}
			fs, err := c.Compile(t.Context(), "order.proto")
			if err != nil {
				t.Fatal(err)
			}
			m := dynamicpb.NewMessage(fs[0].Messages().ByName("Order"))
			if err := protojson.Unmarshal([]byte(`{"id":"o1","total":{"cents":1250,"currency":"EUR"}}`), m); err != nil {
				t.Fatal(err)
			}
			pb, _ := proto.Marshal(m)
			got, err = d.Decode(t.Context(), registry.Protobuf, registrytest.Frame(t, pid, []int{0}, pb))
			if err != nil {
				t.Fatal(err)
			}
			if g, w := compact(t, got), `{"id":"o1","total":{"cents":1250,"currency":"EUR"}}`; g != w {
				t.Errorf("protobuf with an import: got %s, want %s", g, w)
			}
		})
	}
}

// A schema that does not compile is a dead letter for each record of its
// id, asked of the registry once.
func TestBrokenSchemaIsFetchedOnce(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	fake.SeedSchema("b-value", 1, 7, sr.Schema{Schema: `{"type":"recrd","name":"X"}`}) // srfake does not check
	var fetches atomic.Int64
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/schemas/ids/7" {
			fetches.Add(1)
		}
		return false
	})
	d := decoder(t, fake.URL())
	for range 3 {
		_, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, 7, nil, []byte{0}))
		var de *registry.DataError
		if !errors.As(err, &de) || de.SchemaID != 7 || !strings.Contains(de.Reason, "does not compile") {
			t.Fatalf("got %v, want a DataError for schema id 7 that does not compile", err)
		}
	}
	if n := fetches.Load(); n != 1 {
		t.Errorf("the schema was fetched %d times, want 1", n)
	}
}

// TestSchemaIDsNoRegistryKnows: ids no registry assigns (0, and those
// above 2^31-1, which Confluent's clients read as negative) and any 404
// about an id from a registry that otherwise answers are each a
// *DataError naming the id: the record is dead-lettered, never retried
// for ever.
func TestSchemaIDsNoRegistryKnows(t *testing.T) {
	body := []byte{0x04, 'p', '1'}
	frame := func(id uint32) []byte {
		return append([]byte{0, byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}, body...)
	}
	check := func(t *testing.T, d *registry.Decoder, v []byte, name string) {
		t.Helper()
		_, err := d.Decode(t.Context(), registry.Avro, v)
		var de *registry.DataError
		if !errors.As(err, &de) {
			t.Fatalf("got %v (%T), want a *registry.DataError", err, err)
		}
		if !strings.Contains(err.Error(), "schema id "+name) {
			t.Errorf("error %q does not name schema id %s", err, name)
		}
		if registry.IsTransient(err) || registry.IsAuth(err) {
			t.Errorf("classified transient or auth: %v", err)
		}
	}
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			d := decoder(t, url)
			if err := d.Check(t.Context()); err != nil {
				t.Fatal(err)
			}
			check(t, d, frame(0), "0")
			check(t, d, frame(0xFFFFFFFF), "4294967295")
			check(t, d, frame(1<<31), "2147483648")
		})
	}
	t.Run("404 without error code 40403 once the API answered", func(t *testing.T) {
		fake := srfake.New()
		defer fake.Close()
		fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasPrefix(r.URL.Path, "/schemas/ids/") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"error_code":0,"message":"No content with id/hash 'contentId-424242' was found."}`))
				return true
			}
			return false
		})
		d := decoder(t, fake.URL())
		if err := d.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
		check(t, d, frame(424242), "424242")
	})
}

// descriptorForm is a .proto in the form Confluent's Python serializer
// registers: its FileDescriptorProto, serialized, in base64.
func descriptorForm(t *testing.T, name string, srcs map[string]string) string {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(srcs)})}
	fs, err := c.Compile(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	fd := protodesc.ToFileDescriptorProto(fs[0])
	// Python's serialized_pb leaves json_name out.
	for _, m := range fd.MessageType {
		for _, f := range m.Field {
			f.JsonName = nil
		}
	}
	b, err := proto.Marshal(fd)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// TestProtobufDescriptorForm: a schema registered as a base64
// FileDescriptorProto (Confluent's Python serializer), with an import
// registered the same way and well-known types it does not register,
// decodes like its .proto text.
func TestProtobufDescriptorForm(t *testing.T) {
	common := "syntax = \"proto3\";\npackage shop.common;\nmessage Money { string currency = 1; int64 units = 2; int64 small_units = 3; }\n"
	order := "syntax = \"proto3\";\npackage shop;\nimport \"common.proto\";\nimport \"google/protobuf/timestamp.proto\";\n" +
		"message First { string a = 1; }\nmessage Order { string id = 1; shop.common.Money price = 2; google.protobuf.Timestamp at = 3;\n" +
		"  message Line { string sku = 1; } repeated Line lines = 4; }\n"
	srcs := map[string]string{"order.proto": order, "common.proto": common}
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			d := decoder(t, url)
			cs := subject(t)
			registrytest.Register(t, url, cs, sr.Schema{Schema: descriptorForm(t, "common.proto", srcs), Type: sr.TypeProtobuf})
			id := registrytest.Register(t, url, subject(t), sr.Schema{Schema: descriptorForm(t, "order.proto", srcs), Type: sr.TypeProtobuf,
				References: []sr.SchemaReference{{Name: "common.proto", Subject: cs, Version: 1}}})
			md := compileMessage2(t, srcs, "order.proto", "Order")
			m := dynamicpb.NewMessage(md)
			if err := protojson.Unmarshal([]byte(`{"id":"o1","price":{"currency":"EUR","units":5},"at":"2026-01-31T12:30:45Z","lines":[{"sku":"s1"}]}`), m); err != nil {
				t.Fatal(err)
			}
			pb, _ := proto.Marshal(m)
			got, err := d.Decode(t.Context(), registry.Protobuf, registrytest.Frame(t, id, []int{1}, pb))
			if err != nil {
				t.Fatal(err)
			}
			if g, w := compact(t, got), `{"at":"2026-01-31T12:30:45Z","id":"o1","lines":[{"sku":"s1"}],"price":{"currency":"EUR","small_units":"0","units":"5"}}`; g != w {
				t.Errorf("got %s, want %s", g, w)
			}
			got, err = d.Decode(t.Context(), registry.Protobuf, registrytest.Frame(t, id, []int{1, 0}, []byte{0x0a, 0x02, 's', '2'}))
			if err != nil || compact(t, got) != `{"sku":"s2"}` {
				t.Errorf("nested message: got %s, %v", got, err)
			}
			// Base64 that is no FileDescriptorProto is a schema that does
			// not compile: a dead letter naming the id.
			bad := registrytest.Register(t, url, subject(t), sr.Schema{Schema: base64.StdEncoding.EncodeToString([]byte("\xff\xff not a descriptor")), Type: sr.TypeProtobuf})
			_, err = d.Decode(t.Context(), registry.Protobuf, registrytest.Frame(t, bad, []int{0}, nil))
			var de *registry.DataError
			if !errors.As(err, &de) || !strings.Contains(err.Error(), "does not compile") {
				t.Errorf("a broken descriptor: got %v, want a dead letter saying the schema does not compile", err)
			}
		})
	}
}

func compileMessage2(t *testing.T, srcs map[string]string, file, msg string) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(srcs)})}
	fs, err := c.Compile(t.Context(), file)
	if err != nil {
		t.Fatal(err)
	}
	return fs[0].Messages().ByName(protoreflect.Name(msg))
}

// TestAvroTimesOutOfRange: a time of day outside the day, and a date or
// timestamp before year 1 (which Postgres cannot read back from the
// payload), are each a *DataError saying so, not a value that wraps.
func TestAvroTimesOutOfRange(t *testing.T) {
	url := registrytest.Registries(t)["srfake"]
	d := decoder(t, url)
	year0 := time.Date(0, 12, 31, 0, 0, 0, 0, time.UTC)
	long := func(v int64) []byte { return binary.AppendVarint(nil, v) }
	for _, c := range []struct {
		logical, typ string
		body         []byte
		want         string // "" decodes
	}{
		{"time-millis", "int", long(86399999), ""},
		{"time-millis", "int", long(259200000), "outside the day"},
		{"time-millis", "int", long(-5), "outside the day"},
		{"time-micros", "long", long(86400000000), "outside the day"},
		{"time-micros", "long", long(-1), "outside the day"},
		{"date", "int", long(-719162), ""}, // 0001-01-01
		{"date", "int", long(year0.Unix() / 86400), "before year 1"},
		{"timestamp-millis", "long", long(year0.UnixMilli()), "before year 1"},
		{"timestamp-micros", "long", long(year0.UnixMicro()), "before year 1"},
		{"local-timestamp-millis", "long", long(year0.UnixMilli()), "before year 1"},
		{"local-timestamp-micros", "long", long(year0.UnixMicro()), "before year 1"},
	} {
		id := registrytest.Register(t, url, c.logical+"-value", sr.Schema{Schema: `{"type":"` + c.typ + `","logicalType":"` + c.logical + `"}`})
		got, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, id, nil, c.body))
		var de *registry.DataError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s %x: %v", c.logical, c.body, err)
		case c.want != "" && (!errors.As(err, &de) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %x: got %s, %v; want a *DataError containing %q", c.logical, c.body, got, err, c.want)
		}
	}
}
