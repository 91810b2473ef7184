package processor

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

const testID = "7f8a0000-0000-0000-0000-000000000001"

func rec(value string, headers ...string) *kgo.Record {
	r := &kgo.Record{Topic: "orders", Partition: 3, Offset: 42, Value: []byte(value)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

func TestDecode(t *testing.T) {
	order := `{"user_id":1,"items":["A"]}`
	for _, tc := range []struct {
		name   string
		rec    *kgo.Record
		cfg    DecodeConfig
		reason string // "" = decodes
	}{
		{"header id", rec(order, "event_id", testID), DecodeConfig{}, ""},
		{"field id", rec(`{"id":"` + testID + `","user_id":1}`), DecodeConfig{IDField: "id"}, ""},
		{"no header", rec(order), DecodeConfig{}, "no event_id header"},
		{"bad uuid", rec(order, "event_id", "not-a-uuid"), DecodeConfig{}, `event_id header "not-a-uuid" is not a UUID`},
		{"braced uuid", rec(order, "event_id", "{"+testID+"}"), DecodeConfig{}, "is not a UUID"},
		{"invalid json", rec(`{"user_id":`, "event_id", testID), DecodeConfig{}, "value is not valid JSON"},
		{"empty", rec(``, "event_id", testID), DecodeConfig{}, "value is empty"},
		{"nul byte", rec("{\"a\":\"\x00\"}", "event_id", testID), DecodeConfig{}, "NUL byte"},
		{"nul escape", rec(`{"a":"\u0000"}`, "event_id", testID), DecodeConfig{}, `\u0000`},
		{"too large", rec(`{"a":"`+strings.Repeat("x", 100)+`"}`, "event_id", testID), DecodeConfig{MaxBytes: 64}, "over the 64-byte limit"},
		{"field missing", rec(order), DecodeConfig{IDField: "id"}, `no "id" field`},
		{"field not string", rec(`{"id":7}`), DecodeConfig{IDField: "id"}, `field "id" is not a string`},
		{"not an object", rec(`[1]`), DecodeConfig{IDField: "id"}, "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := Decode(tc.rec, tc.cfg)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if ev.ID.String() != testID || ev.Offset != 42 || ev.Partition != 3 {
					t.Errorf("event = %v@%d/%d, want %s@3/42", ev.ID, ev.Partition, ev.Offset, testID)
				}
				return
			}
			de, ok := err.(*DecodeError)
			if !ok {
				t.Fatalf("Decode error = %v, want a *DecodeError with %q", err, tc.reason)
			}
			if !strings.Contains(de.Reason, tc.reason) {
				t.Errorf("reason = %q, want it to contain %q", de.Reason, tc.reason)
			}
			if de.Offset != 42 || de.Topic != "orders" {
				t.Errorf("error position = %s@%d, want orders@42", de.Topic, de.Offset)
			}
		})
	}
}

// FuzzDecode checks that Decode never panics and that whatever it accepts
// has a canonical UUID and a value Postgres can store.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"user_id":1,"items":["A"]}`), []byte(testID), "")
	f.Add([]byte(`{"id":"`+testID+`"}`), []byte(""), "id")
	f.Add([]byte("{\"a\":\"\x00\"}"), []byte(testID), "")
	f.Add([]byte(`{"a":"\u0000"}`), []byte(testID), "")
	f.Fuzz(func(t *testing.T, value, id []byte, field string) {
		r := &kgo.Record{Value: value, Headers: []kgo.RecordHeader{{Key: HeaderEventID, Value: id}}}
		ev, err := Decode(r, DecodeConfig{IDField: field, MaxBytes: 1 << 16})
		if err != nil {
			if _, ok := err.(*DecodeError); !ok {
				t.Fatalf("error is %T, want *DecodeError", err)
			}
			return
		}
		if strings.ContainsRune(string(ev.Value), 0) || strings.Contains(string(ev.Value), `\u0000`) {
			t.Fatalf("accepted a value Postgres cannot store: %q", ev.Value)
		}
		if len(ev.ID.String()) != 36 {
			t.Fatalf("accepted id %v", ev.ID)
		}
	})
}
