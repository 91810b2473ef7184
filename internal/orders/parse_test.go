package orders

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, value, err string
	}{
		{"seed order", `{"user_id":1,"items":["A"]}`, ""},
		{"extra field is ignored", `{"user_id":1,"items":["A"],"coupon":"X"}`, ""},
		{"no user", `{"items":["A"]}`, "user_id must be a positive integer"},
		{"user not a number", `{"user_id":"one","items":["A"]}`, "cannot unmarshal string"},
		{"no items", `{"user_id":1}`, "items is empty"},
		{"empty item", `{"user_id":1,"items":["A",""]}`, "items[1] is empty"},
		{"not json", `user=1`, "not an order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.value))
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("Parse error = %v, want it to mention %q", err, tc.err)
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	v := []byte(`{"user_id":123,"items":["SKU-01","SKU-22"]}`)
	for b.Loop() {
		if _, err := Parse(v); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParse holds Parse to what json.Unmarshal and the checks make of
// any value: the same Order, or an error when json.Unmarshal's path gives
// one. Its seeds run in every go test; go test -fuzz FuzzParse ./orders
// looks further.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"user_id":1,"items":["A"]}`, `{"user_id":123,"items":["SKU-01","SKU-22"]}`,
		` { "items" : [ "a" , "b" ] , "user_id" : 7 } `, "{\"user_id\":\t1,\n\"items\":[\"A\"]}\r\n",
		`{"user_id":1,"items":[]}`, `{}`, `{"user_id":1}`, `{"items":["A"]}`,
		`{"user_id":-1,"items":["A"]}`, `{"user_id":-0,"items":["A"]}`, `{"user_id":0,"items":["A"]}`,
		`{"user_id":01,"items":["A"]}`, `{"user_id":1.0,"items":["A"]}`, `{"user_id":1e3,"items":["A"]}`,
		`{"user_id":999999999999999999,"items":["A"]}`, `{"user_id":9223372036854775807,"items":["A"]}`,
		`{"user_id":9223372036854775808,"items":["A"]}`, `{"user_id":-,"items":["A"]}`,
		`{"user_id":1,"user_id":2,"items":["A"]}`, `{"user_id":1,"items":["A"],"items":["B","C"]}`,
		`{"User_ID":5,"items":["A"]}`, `{"ITEMS":["A"],"user_id":1}`, `{"user_\u0069d":1,"items":["A"]}`,
		`{"user_id":1,"items":["A\"B"]}`, `{"user_id":1,"items":["\u00e9"]}`, "{\"user_id\":1,\"items\":[\"\xff\"]}",
		"{\"user_id\":1,\"items\":[\"\xc3\xa9\"]}", `{"user_id":1,"items":["A",""]}`, `{"user_id":1,"items":["A",]}`,
		`{"user_id":1,"items":["A"],}`, `{"user_id":1,"items":["A"]}x`, `{"user_id":1,"items":["A"]}{}`,
		`{"user_id":1,"items":null}`, `{"user_id":null,"items":["A"]}`, `{"user_id":1,"items":[null]}`,
		`{"user_id":1,"items":[1]}`, `{"user_id":"1","items":["A"]}`, `{"user_id":1,"items":"A"}`,
		`{"user_id":1,"items":["A"],"coupon":{"x":[1,2]}}`, `[]`, `null`, ``, `{`, `{"user_id"`, `{"user_id":1,"items":["A"`,
		`{"user_id":1 "items":["A"]}`, `{"user_id" 1}`, "{\"user_id\":1,\"items\":[\"a\tb\"]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		got, err := Parse(v)
		var want Order
		werr := json.Unmarshal(v, &want)
		if werr != nil {
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, nil; json.Unmarshal: %v", v, got, werr)
			}
			if !strings.Contains(err.Error(), werr.Error()) {
				t.Fatalf("Parse(%q) error %q, want json.Unmarshal's %q", v, err, werr)
			}
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Parse(%q) = %#v, json.Unmarshal = %#v", v, got, want)
		}
		if valid := want.UserID > 0 && len(want.Items) > 0 && !slices.Contains(want.Items, ""); valid != (err == nil) {
			t.Fatalf("Parse(%q) error %v, want an error: %v", v, err, !valid)
		}
	})
}

// TestReadOrderReadsProducersShape keeps the fast path in use: the shape
// Generate and the producer write, and its variants with whitespace and
// member order, are read without encoding/json.
func TestReadOrderReadsProducersShape(t *testing.T) {
	for _, s := range []string{
		`{"user_id":123,"items":["SKU-01","SKU-22"]}`,
		` { "items" : [ "a" , "b" ] , "user_id" : 7 } `,
		`{"user_id":1,"items":[]}`,
	} {
		if _, ok := readOrder([]byte(s)); !ok {
			t.Errorf("readOrder(%s) left it to encoding/json", s)
		}
	}
	v, err := json.Marshal(Order{UserID: 42, Items: []string{"A", "B-2"}})
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := readOrder(v); !ok || o.UserID != 42 || !slices.Equal(o.Items, []string{"A", "B-2"}) {
		t.Errorf("readOrder(%s) = %+v, %v", v, o, ok)
	}
}
