package registry_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/registry/registrytest"
)

// The Encoder is the Decoder's inverse: the payload a Decoder writes,
// encoded and decoded again, is the same payload; a field left out takes
// the schema's default.
func TestEncoderRoundTrip(t *testing.T) {
	avroPayload := `{"id":"6f1c8a4e-2b7d-4c1e-9a0f-3d5b7e9c1a2b","active":true,"qty":3,"big":9007199254740993,"ratio":0.5,"score":2.25,` +
		`"note":"tab\there","raw":"AAH/","nothing":null,"maybe":"yes","maybe_not":null,"status":"PAID","tag":"q80=",` +
		`"items":[{"sku":"a","n":1}],"attrs":{"a":1,"k":7},"either":{"sku":"x","n":1},"amount":-123.45,"refund":0.05,"day":"2026-01-31",` +
		`"at_ms":"2026-01-31T12:30:45.123Z","at_us":"2026-01-31T12:30:45.123456Z","local_ms":"2026-01-31T12:30:45.123",` +
		`"tod_ms":"03:04:05.006","tod_us":"03:04:05.006007","period":{"months":1,"days":2,"milliseconds":3}}`
	protoPayload := `{"id":"o-1","qty":3,"cents":"-1999","big":"18446744073709551615","score":2.5,"active":true,"raw":"AAH/",` +
		`"status":"PAID","items":[{"sku":"a","n":1}],"attrs":{"k":"7"},"at":"2026-01-31T12:30:45.123456Z","took":"1.500s",` +
		`"maybe":"yes","extra":{"a":[1,"b",null]},"unset":null,"card":"4111","ratio":0.5,"empty":""}`
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			d := decoder(t, url)
			for _, c := range []struct {
				name    string
				src     registry.Source
				payload string
			}{
				{"avro", registry.Source{Kind: registry.Avro, Text: avroOrder}, avroPayload},
				{"protobuf", registry.Source{Kind: registry.Protobuf, Text: protoOrder, Message: "Order"}, protoPayload},
			} {
				t.Run(c.name, func(t *testing.T) {
					e, err := registry.NewEncoder(t.Context(), registry.Config{URL: url, Timeout: 5 * time.Second}, subject(t), c.src)
					if err != nil {
						t.Fatal(err)
					}
					v, err := e.Encode([]byte(c.payload))
					if err != nil {
						t.Fatal(err)
					}
					got, err := d.Decode(t.Context(), c.src.Kind, v)
					if err != nil {
						t.Fatal(err)
					}
					if g, w := compact(t, got), compact(t, []byte(c.payload)); g != w {
						t.Errorf("round trip:\n got %s\nwant %s", g, w)
					}
				})
			}
		})
	}
}

func TestEncoderDefaultsAndErrors(t *testing.T) {
	url := registrytest.Registries(t)["srfake"]
	v2 := `{"type":"record","name":"Payment","fields":[{"name":"id","type":"string"},{"name":"currency","type":"string","default":"EUR"},
	 {"name":"memo","type":["null","string"],"default":null},{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}}]}`
	e, err := registry.NewEncoder(t.Context(), registry.Config{URL: url}, "p-value", registry.Source{Kind: registry.Avro, Text: v2})
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.Encode([]byte(`{"id":"p1","amount":"12.5"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := decoder(t, url).Decode(t.Context(), registry.Avro, v)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := compact(t, got), `{"amount":12.50,"currency":"EUR","id":"p1","memo":null}`; g != w {
		t.Errorf("defaults: got %s, want %s", g, w)
	}
	for _, c := range []struct{ value, want string }{
		{`{"amount":1}`, `no field "id", which has no default`},
		{`{"id":"p","amount":1,"cur":"x"}`, `field "cur" is not in record Payment`},
		{`{"id":"p","amount":1.234}`, "more than 2 decimals"},
		{`{"id":7,"amount":1}`, `value.id: 7, want a string`},
		{`{"id":"p"`, "not JSON"},
	} {
		if _, err := e.Encode([]byte(c.value)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Encode(%s): %v, want an error containing %q", c.value, err, c.want)
		}
	}
	if _, err := registry.NewEncoder(t.Context(), registry.Config{URL: url}, "x-value", registry.Source{Kind: registry.Protobuf, Text: protoOrder, Message: "Nope"}); err == nil || !strings.Contains(err.Error(), `no message "Nope"`) {
		t.Errorf("unknown message: %v", err)
	}
	if _, err := registry.NewEncoder(t.Context(), registry.Config{URL: url}, "x-value", registry.Source{Kind: registry.Avro, Text: `{"type":"recrd"}`}); err == nil || !strings.Contains(err.Error(), "avro schema") {
		t.Errorf("bad avro schema: %v", err)
	}
}

// TestEncoderProtobufImports: a .proto importing a file beside it (by a
// path relative to its directory) compiles; each imported file is
// registered under its own subject (its import path, as Confluent's
// serializers do) and referenced, so a Decoder reads the records; a
// missing import names the file given.
func TestEncoderProtobufImports(t *testing.T) {
	for name, url := range registrytest.Registries(t) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			// A directory of the import path no other run uses: the
			// subject is the import path, and the registry is shared.
			pkg := fmt.Sprintf("t%d", time.Now().UnixNano())
			if err := os.MkdirAll(filepath.Join(dir, pkg), 0o755); err != nil {
				t.Fatal(err)
			}
			write := func(p, text string) {
				if err := os.WriteFile(filepath.Join(dir, p), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(pkg+"/level.proto", "syntax = \"proto3\";\npackage common;\nenum Level { LEVEL_UNSPECIFIED = 0; HIGH = 1; }\n")
			write(pkg+"/common.proto", "syntax = \"proto3\";\npackage common;\nimport \""+pkg+"/level.proto\";\nmessage Money { string currency = 1; int64 units = 2; Level level = 3; }\n")
			order := "syntax = \"proto3\";\npackage shop;\nimport \"" + pkg + "/common.proto\";\nimport \"google/protobuf/timestamp.proto\";\n" +
				"message Order { string id = 1; common.Money price = 2; google.protobuf.Timestamp at = 3; }\n"
			write("order.proto", order)
			path := filepath.Join(dir, "order.proto")
			e, err := registry.NewEncoder(t.Context(), registry.Config{URL: url, Timeout: 5 * time.Second}, subject(t),
				registry.Source{Kind: registry.Protobuf, Text: order, Path: path, Message: "Order"})
			if err != nil {
				t.Fatal(err)
			}
			payload := `{"at":"2026-01-31T12:30:45Z","id":"o1","price":{"currency":"EUR","level":"HIGH","units":"5"}}`
			v, err := e.Encode([]byte(payload))
			if err != nil {
				t.Fatal(err)
			}
			got, err := decoder(t, url).Decode(t.Context(), registry.Protobuf, v)
			if err != nil {
				t.Fatal(err)
			}
			if g := compact(t, got); g != payload {
				t.Errorf("got %s, want %s", g, payload)
			}
			cl, _ := sr.NewClient(sr.URLs(url))
			if _, err := cl.SchemaByVersion(t.Context(), pkg+"/common.proto", -1); err != nil {
				t.Errorf("the import is not registered under subject %s/common.proto: %v", pkg, err)
			}

			missing := "syntax = \"proto3\";\nimport \"nowhere.proto\";\nmessage M { string a = 1; }\n"
			write("missing.proto", missing)
			_, err = registry.NewEncoder(t.Context(), registry.Config{URL: url}, subject(t),
				registry.Source{Kind: registry.Protobuf, Text: missing, Path: filepath.Join(dir, "missing.proto")})
			if err == nil || !strings.Contains(err.Error(), "missing.proto") || !strings.Contains(err.Error(), "nowhere.proto") || strings.Contains(err.Error(), "schema.proto") {
				t.Errorf("a missing import: got %v, want an error naming missing.proto and nowhere.proto", err)
			}
		})
	}
}

// TestEncoderMessageNames: --message resolves as protoc does: relative to
// the file's package, full, with a leading dot, or a unique short name.
func TestEncoderMessageNames(t *testing.T) {
	url := registrytest.Registries(t)["srfake"]
	d := decoder(t, url)
	for _, name := range []string{"Order.Item", "shop.Order.Item", ".shop.Order.Item", "Item"} {
		e, err := registry.NewEncoder(t.Context(), registry.Config{URL: url}, "x-value", registry.Source{Kind: registry.Protobuf, Text: protoOrder, Message: name})
		if err != nil {
			t.Errorf("--message %s: %v", name, err)
			continue
		}
		v, err := e.Encode([]byte(`{"sku":"a","n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := d.Decode(t.Context(), registry.Protobuf, v); err != nil || compact(t, got) != `{"n":1,"sku":"a"}` {
			t.Errorf("--message %s: decoded %s, %v", name, got, err)
		}
	}
}

// TestEncoderRefusesWhatTheSchemaCannotHold: a decimal over its declared
// precision, and a time with digits below the unit of its logical type,
// are refused (as Java's Avro refuses them), not sent changed.
func TestEncoderRefusesWhatTheSchemaCannotHold(t *testing.T) {
	url := registrytest.Registries(t)["srfake"]
	schema := `{"type":"record","name":"R","fields":[
	 {"name":"amount","type":["null",{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}],"default":null},
	 {"name":"fixed","type":["null",{"type":"fixed","name":"F","size":16,"logicalType":"decimal","precision":4,"scale":1}],"default":null},
	 {"name":"ms","type":["null",{"type":"long","logicalType":"timestamp-millis"}],"default":null},
	 {"name":"us","type":["null",{"type":"long","logicalType":"timestamp-micros"}],"default":null},
	 {"name":"lms","type":["null",{"type":"long","logicalType":"local-timestamp-millis"}],"default":null},
	 {"name":"tms","type":["null",{"type":"int","logicalType":"time-millis"}],"default":null},
	 {"name":"tus","type":["null",{"type":"long","logicalType":"time-micros"}],"default":null}]}`
	e, err := registry.NewEncoder(t.Context(), registry.Config{URL: url}, "r-value", registry.Source{Kind: registry.Avro, Text: schema})
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{`{"amount":9999999999.99}`, `{"amount":"-9999999999.99"}`, `{"fixed":999.9}`,
		`{"ms":"2026-01-31T12:30:45.123Z"}`, `{"us":"2026-01-31T12:30:45.123456Z"}`, `{"lms":"2026-01-31T12:30:45.123"}`,
		`{"tms":"03:04:05.006"}`, `{"tus":"03:04:05.006007"}`} {
		if _, err := e.Encode([]byte(ok)); err != nil {
			t.Errorf("Encode(%s): %v", ok, err)
		}
	}
	for _, c := range []struct{ value, want string }{
		{`{"amount":99999999999.99}`, "precision 12"},
		{`{"amount":"-99999999999.99"}`, "precision 12"},
		{`{"fixed":1000.0}`, "precision 4"},
		{`{"ms":"2026-01-31T12:30:45.1234Z"}`, "below the millisecond"},
		{`{"us":"2026-01-31T12:30:45.1234567Z"}`, "below the microsecond"},
		{`{"lms":"2026-01-31T12:30:45.1239"}`, "below the millisecond"},
		{`{"tms":"03:04:05.0061"}`, "below the millisecond"},
		{`{"tus":"03:04:05.0060071"}`, "below the microsecond"},
	} {
		if _, err := e.Encode([]byte(c.value)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Encode(%s): %v, want an error containing %q", c.value, err, c.want)
		}
	}
}

// TestEncoderAvroSchemaNotJSON: a truncated .avsc is reported as JSON
// that does not parse, where, not as an unknown Avro type.
func TestEncoderAvroSchemaNotJSON(t *testing.T) {
	url := registrytest.Registries(t)["srfake"]
	text := "{\"type\":\"record\",\"name\":\"R\",\n \"fields\":[{\"name\":\"a\",\"type\":\"string\"}"
	_, err := registry.NewEncoder(t.Context(), registry.Config{URL: url}, "r-value", registry.Source{Kind: registry.Avro, Text: text, Path: "r.avsc"})
	if err == nil || !strings.Contains(err.Error(), "not valid JSON") || !strings.Contains(err.Error(), "r.avsc") || strings.Contains(err.Error(), "unknown type") {
		t.Errorf("a truncated .avsc: got %v, want an error naming r.avsc and saying it is not valid JSON", err)
	}
}

// A registration the registry refuses although the schema is there under
// the subject (Apicurio answers "already exists" to registrations of a new
// subject, or of a new version, that lose a race) stands as registered:
// the Encoder writes with the schema's id. One refused so while the schema
// is not there (the race won by another schema) is made again, as long as
// the refusals say so, a few times; any other refusal is returned at
// once.
func TestEncoderRegistrationRefusedButThere(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	target, _ := url.Parse(fake.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	var (
		mu       sync.Mutex
		makeThen int    // registrations to make, then answer 409
		refuse   int    // registrations to answer 409 without making them
		msg      string // the 409's message
		posts    int    // registrations asked for
	)
	set := func(m, r int, s string) { mu.Lock(); makeThen, refuse, msg, posts = m, r, s, 0; mu.Unlock() }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/versions") {
			proxy.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		posts++
		made, refused, m := makeThen > 0, makeThen == 0 && refuse > 0, msg
		if made {
			makeThen--
		} else if refused {
			refuse--
		}
		mu.Unlock()
		switch {
		case made:
			proxy.ServeHTTP(httptest.NewRecorder(), r)
		case !refused:
			proxy.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"error_code":409,"message":%q}`, m)
	}))
	defer srv.Close()
	cfg := registry.Config{URL: srv.URL, Timeout: 5 * time.Second}
	src := registry.Source{Kind: registry.Protobuf, Text: protoOrder, Message: "Order"}
	const subjectExists = "An artifact with ID 'orders-value' in group 'null' already exists."
	const versionExists = "An artifact version 'null' for artifact ID 'orders-value' in group 'null' already exists."

	set(1, 0, subjectExists)
	e, err := registry.NewEncoder(t.Context(), cfg, "orders-value", src)
	if err != nil {
		t.Fatalf("a registration answered 409 whose schema is there: %v", err)
	}
	v, err := e.Encode([]byte(`{"id":"o-1","qty":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decoder(t, fake.URL()).Decode(t.Context(), registry.Protobuf, v); err != nil {
		t.Errorf("the record written with the id found: %v", err)
	}

	// Refused, the schema not there (another schema won the race to create
	// the subject, then the race to add a version): registered again.
	set(0, 2, subjectExists)
	if _, err := registry.NewEncoder(t.Context(), cfg, "third-value", src); err != nil {
		t.Errorf("a registration refused twice as raced, its schema not there: %v, want it registered at the third", err)
	}
	set(0, 2, versionExists)
	if _, err := registry.NewEncoder(t.Context(), cfg, "fourth-value", src); err != nil {
		t.Errorf("a version's registration refused twice as raced: %v, want it registered at the third", err)
	}

	// A refusal that is not a race is returned at once; one that keeps
	// saying "already exists" without the schema there, after a few tries.
	set(0, 100, "Schema being registered is incompatible with an earlier schema")
	if _, err := registry.NewEncoder(t.Context(), cfg, "other-value", src); err == nil || !strings.Contains(err.Error(), "incompatible") {
		t.Errorf("an incompatible schema: %v, want the registry's refusal", err)
	}
	mu.Lock()
	if posts != 1 {
		t.Errorf("an incompatible schema: registered %d times, want once", posts)
	}
	mu.Unlock()
	set(0, 100, subjectExists)
	if _, err := registry.NewEncoder(t.Context(), cfg, "stuck-value", src); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("refused as raced at every try: %v, want the registry's refusal", err)
	}
	mu.Lock()
	if posts < 2 || posts > 10 {
		t.Errorf("refused as raced at every try: registered %d times, want a few", posts)
	}
	mu.Unlock()
}
