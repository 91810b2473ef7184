package registry_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/registry/registrytest"
)

// fuzzDecoder serves avroOrder as schema id 1 and protoOrder as id 2 from
// srfake.
func fuzzDecoder(f *testing.F) *registry.Decoder {
	fake := srfake.New()
	f.Cleanup(fake.Close)
	fake.SeedSchema("order-avro", 1, 1, sr.Schema{Schema: avroOrder})
	fake.SeedSchema("order-proto", 1, 2, sr.Schema{Schema: protoOrder, Type: sr.TypeProtobuf})
	d, err := registry.New(registry.Config{URL: fake.URL()})
	if err != nil {
		f.Fatal(err)
	}
	return d
}

// check holds for every input: valid JSON without \u0000, or a
// *DataError; never a panic, never another error from a healthy registry.
func check(t *testing.T, out []byte, err error) {
	var de *registry.DataError
	switch {
	case err == nil:
		if !json.Valid(out) {
			t.Fatalf("decoded to invalid JSON: %q", out)
		}
	case !errors.As(err, &de):
		t.Fatalf("got %v (%T), want a *registry.DataError", err, err)
	}
}

// FuzzDecodeAvro feeds Avro bodies of the order schema (every type and
// logical type) to the decoder. Seeds: testdata/fuzz/FuzzDecodeAvro.
func FuzzDecodeAvro(f *testing.F) {
	d := fuzzDecoder(f)
	good, err := avro.Marshal(avro.MustParse(avroOrder), sampleAvroOrder())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := d.Decode(t.Context(), registry.Avro, registrytest.Frame(t, 1, nil, body))
		check(t, out, err)
	})
}

// FuzzDecodeProtobuf feeds message indexes and bodies of the order file.
// Seeds: testdata/fuzz/FuzzDecodeProtobuf.
func FuzzDecodeProtobuf(f *testing.F) {
	d := fuzzDecoder(f)
	f.Add([]byte{0, 0x0a, 0x03, 'o', '-', '1'})
	f.Add([]byte{2, 2, 0, 0x0a, 0x01, 'z'})
	f.Add([]byte{0x7f})
	f.Fuzz(func(t *testing.T, rest []byte) {
		out, err := d.Decode(t.Context(), registry.Protobuf, append([]byte{0, 0, 0, 0, 2}, rest...))
		check(t, out, err)
	})
}
