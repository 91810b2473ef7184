package registry_test

import (
	"strings"
	"testing"
	"time"

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
