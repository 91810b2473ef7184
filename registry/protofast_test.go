package registry

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

const fastProtoFile = `syntax = "proto3";
package fast;
enum Color { RED = 0; GREEN = 1; BLUE = 2; }
message All {
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5; sint64 s64 = 6;
  fixed32 f32 = 7; fixed64 f64 = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10;
  float fl = 11; double db = 12; bool b = 13; string s = 14; bytes by = 15; Color c = 16;
  All child = 17;
  repeated int32 ri32 = 18; repeated sint64 rs64 = 19; repeated double rdb = 20 [packed = false];
  repeated string rs = 21; repeated bytes rby = 22; repeated All rchild = 23; repeated Color rc = 24;
  repeated fixed32 rf32 = 25; repeated bool rb = 26;
}
message WithMap { map<string, int32> m = 1; }
`

func fastSchema(t testing.TB) *schema {
	s := &schema{id: 1, typ: sr.TypeProtobuf}
	if err := s.compile(fastProtoFile, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

func sameJSON(t *testing.T, a, b []byte) bool {
	norm := func(x []byte) string {
		var v any
		d := json.NewDecoder(bytes.NewReader(x))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatalf("not JSON: %s", x)
		}
		out, _ := json.Marshal(v)
		return string(out)
	}
	return norm(a) == norm(b)
}

func TestFastProtoEligibility(t *testing.T) {
	s := fastSchema(t)
	if !s.fast["fast.All"] || s.fast["fast.WithMap"] {
		t.Errorf("fast = %v, want fast.All and not fast.WithMap", s.fast)
	}
}

// The fast path and protojson agree on every field kind, set and unset,
// packed and not, merged messages, unknown fields.
func TestFastProtoMatchesProtojson(t *testing.T) {
	s := fastSchema(t)
	md := s.file.Messages().ByName("All")
	for _, in := range []string{
		`{}`,
		`{"i32":-5,"i64":"-9007199254740993","u32":4294967295,"u64":"18446744073709551615","s32":-7,"s64":"-8",
		  "f32":7,"f64":"8","sf32":-9,"sf64":"-10","fl":1.5,"db":-2.25e-9,"b":true,"s":"héllo\n\"x\"","by":"AAH/","c":"BLUE",
		  "child":{"s":"kid","child":{"i32":1}},"ri32":[1,-2,3],"rs64":["-1","2"],"rdb":[0.5,1e300],"rs":["a",""],"rby":["AA=="],
		  "rchild":[{},{"b":true}],"rc":["GREEN","RED"],"rf32":[1,2],"rb":[true,false]}`,
		`{"fl":1e30,"db":1e21,"c":"RED","child":{}}`,
	} {
		m := dynamicpb.NewMessage(md)
		if err := protojson.Unmarshal([]byte(in), m); err != nil {
			t.Fatal(err)
		}
		body, _ := proto.Marshal(m)
		// Merges and unknown fields: the child again (merged), field 99.
		extra := []byte{0x8a, 0x01, 0x02, 0x08, 0x2a, 0x98, 0x06, 0x01}
		for _, b := range [][]byte{body, append(append([]byte{}, body...), extra...)} {
			fast, ok := fastProto(nil, md, b, 0)
			if !ok {
				t.Fatalf("fast path refused %s", in)
			}
			slow, err := s.slowProtobuf(md, b)
			if err != nil {
				t.Fatal(err)
			}
			if !sameJSON(t, fast, slow) {
				t.Errorf("fast %s\nslow %s", fast, slow)
			}
		}
	}
}

// FuzzProtobufFastPath: whenever the fast path reads a body, the general
// path reads it too, to the same JSON.
func FuzzProtobufFastPath(f *testing.F) {
	s := fastSchema(f)
	md := s.file.Messages().ByName("All")
	m := dynamicpb.NewMessage(md)
	_ = protojson.Unmarshal([]byte(`{"i32":-5,"s":"x","child":{"ri32":[1,2]},"rs":["a"],"rdb":[1.5],"c":"GREEN"}`), m)
	seed, _ := proto.Marshal(m)
	f.Add(seed)
	f.Add([]byte{0x8a, 0x01, 0x02, 0x08, 0x2a, 0x8a, 0x01, 0x02, 0x10, 0x01})
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, ok := fastProto(nil, md, body, 0)
		if !ok {
			return
		}
		slow, err := s.slowProtobuf(md, body)
		if err != nil {
			t.Fatalf("fast path read %x, the general path refused it: %v", body, err)
		}
		if !sameJSON(t, fast, slow) {
			t.Fatalf("body %x:\nfast %s\nslow %s", body, fast, slow)
		}
	})
}
