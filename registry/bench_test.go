package registry_test

import (
	"encoding/json"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/registry/registrytest"
)

// The seed's order ({"user_id":…,"items":[…]}) as JSON, Avro and Protobuf:
// what decoding one costs once its schema is cached. For the JSON row,
// json.Valid is the check processor.Decode makes of a JSON value.
func BenchmarkDecodeOrder(b *testing.B) {
	fake := srfake.New()
	defer fake.Close()
	const avroSchema = `{"type":"record","name":"Order","fields":[{"name":"user_id","type":"long"},{"name":"items","type":{"type":"array","items":"string"}}]}`
	const protoSchema = "syntax = \"proto3\";\nmessage Order { int64 user_id = 1; repeated string items = 2; }\n"
	fake.SeedSchema("a", 1, 1, sr.Schema{Schema: avroSchema})
	fake.SeedSchema("p", 1, 2, sr.Schema{Schema: protoSchema, Type: sr.TypeProtobuf})
	d, err := registry.New(registry.Config{URL: fake.URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	jsonValue := []byte(`{"user_id":417,"items":["item-07","item-23","item-41"]}`)
	ab, _ := avro.Marshal(avro.MustParse(avroSchema), map[string]any{"user_id": int64(417), "items": []string{"item-07", "item-23", "item-41"}})
	md := compileProto(b, protoSchema, "Order")
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("user_id"), protoreflectValueOfInt64(417))
	l := m.Mutable(md.Fields().ByName("items")).List()
	for _, s := range []string{"item-07", "item-23", "item-41"} {
		l.Append(protoreflectValueOfString(s))
	}
	pb, _ := proto.Marshal(m)
	avroValue := registrytest.Frame(b, 1, nil, ab)
	protoValue := registrytest.Frame(b, 2, []int{0}, pb)
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			if !json.Valid(jsonValue) {
				b.Fatal("invalid")
			}
		}
	})
	for _, c := range []struct {
		name  string
		kind  registry.Kind
		value []byte
	}{{"avro", registry.Avro, avroValue}, {"protobuf", registry.Protobuf, protoValue}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := d.Decode(b.Context(), c.kind, c.value); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
