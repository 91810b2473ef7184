package processor

import (
	"bytes"
	"cmp"
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
	keyed := func(r *kgo.Record, key string) *kgo.Record { r.Key = []byte(key); return r }
	offsetID := OffsetID("orders", 3, 42).String()
	for _, tc := range []struct {
		name   string
		rec    *kgo.Record
		cfg    DecodeConfig
		reason string // "" = decodes
		id     string // the id decoded; default testID
	}{
		{"header id", rec(order, "event_id", testID), DecodeConfig{}, "", ""},
		{"field id", rec(`{"id":"` + testID + `","user_id":1}`), DecodeConfig{IDField: "id"}, "", ""},
		{"field id, explicit source", rec(`{"id":"` + testID + `"}`), DecodeConfig{IDSource: IDFromField, IDField: "id"}, "", ""},
		{"named header", rec(order, "msg-id", testID, "event_id", "not-this"), DecodeConfig{IDHeader: "msg-id"}, "", ""},
		{"named header missing", rec(order, "event_id", testID), DecodeConfig{IDHeader: "msg-id"}, "no msg-id header", ""},
		{"key id", keyed(rec(order), testID), DecodeConfig{IDSource: IDFromKey}, "", ""},
		{"key not a uuid", keyed(rec(order), "user-1"), DecodeConfig{IDSource: IDFromKey}, `record key "user-1" is not a UUID`, ""},
		{"no key", rec(order), DecodeConfig{IDSource: IDFromKey}, "no record key", ""},
		{"offset id", rec(order), DecodeConfig{IDSource: IDFromOffset}, "", offsetID},
		{"offset id ignores the header", rec(order, "event_id", testID), DecodeConfig{IDSource: IDFromOffset}, "", offsetID},
		{"bytes: not json", rec("\x00\xffraw", "event_id", testID), DecodeConfig{Format: FormatBytes}, "", ""},
		{"bytes: empty", rec("", "event_id", testID), DecodeConfig{Format: FormatBytes}, "", ""},
		{"bytes: too large", rec(strings.Repeat("x", 100), "event_id", testID), DecodeConfig{Format: FormatBytes, MaxBytes: 64}, "over the 64-byte limit", ""},
		{"bytes: still needs an id", rec("raw"), DecodeConfig{Format: FormatBytes}, "no event_id header", ""},
		{"bytes with a field id", rec(`{"id":"` + testID + `"}`), DecodeConfig{Format: FormatBytes, IDField: "id"}, "needs format json", ""},
		{"no header", rec(order), DecodeConfig{}, "no event_id header", ""},
		{"two id headers", rec(order, "event_id", testID, "event_id", "7f8a0000-0000-0000-0000-0000000000c1"), DecodeConfig{}, "2 event_id headers: the event id is ambiguous", ""},
		{"bad uuid", rec(order, "event_id", "not-a-uuid"), DecodeConfig{}, `event_id header "not-a-uuid" is not a UUID`, ""},
		{"braced uuid", rec(order, "event_id", "{"+testID+"}"), DecodeConfig{}, "is not a UUID", ""},
		{"invalid json", rec(`{"user_id":`, "event_id", testID), DecodeConfig{}, "value is not valid JSON", ""},
		{"empty", rec(``, "event_id", testID), DecodeConfig{}, "value is empty", ""},
		{"nul byte", rec("{\"a\":\"\x00\"}", "event_id", testID), DecodeConfig{}, "NUL byte", ""},
		{"nul escape", rec(`{"a":"\u0000"}`, "event_id", testID), DecodeConfig{}, `\u0000`, ""},
		{"escaped backslash before u0000", rec(`{"memo":"C:\\u0000dir"}`, "event_id", testID), DecodeConfig{}, "", ""},
		{"escaped backslash before the escape", rec(`{"memo":"C:\\\u0000dir"}`, "event_id", testID), DecodeConfig{}, `\u0000`, ""},
		{"too large", rec(`{"a":"`+strings.Repeat("x", 100)+`"}`, "event_id", testID), DecodeConfig{MaxBytes: 64}, "over the 64-byte limit", ""},
		{"field missing", rec(order), DecodeConfig{IDField: "id"}, `no "id" field`, ""},
		{"field not string", rec(`{"id":7}`), DecodeConfig{IDField: "id"}, `field "id" is not a string`, ""},
		{"not an object", rec(`[1]`), DecodeConfig{IDField: "id"}, "not a JSON object", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := Decode(tc.rec, tc.cfg)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				want := cmp.Or(tc.id, testID)
				if ev.ID.String() != want || ev.Offset != 42 || ev.Partition != 3 {
					t.Errorf("event = %v@%d/%d, want %s@3/42", ev.ID, ev.Partition, ev.Offset, want)
				}
				if !bytes.Equal(ev.Value, tc.rec.Value) || !bytes.Equal(ev.Key, tc.rec.Key) || len(ev.Headers) != len(tc.rec.Headers) {
					t.Errorf("event value %q key %q %d headers, want the record's %q %q %d",
						ev.Value, ev.Key, len(ev.Headers), tc.rec.Value, tc.rec.Key, len(tc.rec.Headers))
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

// A record refused for its value keeps its event id wherever the id can
// be read: from its header, or from the JSON field as far as the value
// parses, so that its dead letter is found by the id (onceflow audit).
func TestDecodeErrorKeepsReadableID(t *testing.T) {
	big := strings.Repeat("x", 100)
	field := DecodeConfig{IDField: "id", MaxBytes: 64}
	for _, tc := range []struct {
		name string
		rec  *kgo.Record
		cfg  DecodeConfig
		id   string // "" = none readable
	}{
		{"header, nul escape", rec(`{"a":"\u0000"}`, "event_id", testID), DecodeConfig{}, testID},
		{"header, too large", rec(`{"a":"`+big+`"}`, "event_id", testID), DecodeConfig{MaxBytes: 64}, testID},
		{"header, nul byte", rec("{\"a\":\"\x00\"}", "event_id", testID), DecodeConfig{}, testID},
		{"header, invalid json", rec(`{"a":`, "event_id", testID), DecodeConfig{}, testID},
		{"header, two of them", rec(`{"a":"\u0000"}`, "event_id", testID, "event_id", testID), DecodeConfig{}, ""},
		{"field, nul escape", rec(`{"id":"` + testID + `","a":"\u0000"}`), field, testID},
		{"field, too large", rec(`{"a":"` + big + `","id":"` + testID + `"}`), field, testID},
		{"field, nul byte after it", rec("{\"id\":\"" + testID + "\",\"a\":\"\x00\"}"), field, testID},
		{"field, truncated after it", rec(`{"id":"` + testID + `","a":[1,`), field, testID},
		{"field, nul byte before it", rec("{\"a\":\"\x00\",\"id\":\"" + testID + "\"}"), field, ""},
		{"field not a uuid", rec(`{"id":"x","a":"\u0000"}`), field, ""},
		{"field repeated, the last not a uuid", rec(`{"id":"` + testID + `","id":"x","a":"\u0000"}`), field, ""},
		{"field nested only", rec(`{"a":{"id":"` + testID + `"},"b":"\u0000"}`), field, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.rec, tc.cfg)
			de, ok := err.(*DecodeError)
			if !ok {
				t.Fatalf("Decode error = %v, want a *DecodeError", err)
			}
			got := ""
			if de.EventID.Valid {
				got = de.EventID.UUID.String()
			}
			if got != tc.id {
				t.Errorf("DecodeError.EventID = %q, want %q (reason %q)", got, tc.id, de.Reason)
			}
		})
	}
}

// The ids derived from offsets are a stored identity: they must never
// change. The values were computed independently (Python's uuid.uuid5).
func TestOffsetID(t *testing.T) {
	if got, want := OffsetIDNamespace.String(), "3fd26761-621d-53a5-a8c2-4a8f6cdf7047"; got != want {
		t.Errorf("OffsetIDNamespace = %s, want %s", got, want)
	}
	if got, want := OffsetID("orders", 3, 42).String(), "5dfc2192-2560-5c70-965b-ca2d5512cde4"; got != want {
		t.Errorf(`OffsetID("orders", 3, 42) = %s, want %s`, got, want)
	}
	if OffsetID("orders", 3, 42) == OffsetID("orders", 34, 2) || OffsetID("orders", 3, 42) == OffsetID("orders", 3, 43) {
		t.Error("OffsetID gives the same id to different records")
	}
}

func TestDecodeConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  DecodeConfig
		want []string // none: valid
	}{
		{"zero", DecodeConfig{}, nil},
		{"every source", DecodeConfig{IDSource: IDFromOffset, Format: FormatBytes}, nil},
		{"field", DecodeConfig{IDSource: IDFromField, IDField: "id"}, nil},
		{"unknown format", DecodeConfig{Format: "xml"}, []string{`Decode.Format "xml"`}},
		{"unknown source", DecodeConfig{IDSource: "body"}, []string{`Decode.IDSource "body"`}},
		{"field without name", DecodeConfig{IDSource: IDFromField}, []string{"Decode.IDField is required"}},
		{"field name with another source", DecodeConfig{IDSource: IDFromKey, IDField: "id"}, []string{`Decode.IDField "id" is set but IDSource is key`}},
		{"field with bytes", DecodeConfig{IDField: "id", Format: FormatBytes}, []string{"needs Format json"}},
		{"negative size", DecodeConfig{MaxBytes: -1}, []string{"Decode.MaxBytes -1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %v, want it to contain %q", err, w)
				}
			}
		})
	}
}

// FuzzDecode checks that Decode never panics and that whatever it accepts
// has a canonical UUID and, with FormatJSON, a value Postgres can store.
// mode picks the id source (mode%4: header, field, key, offset) and the
// format (mode/4%2: json, bytes).
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"user_id":1,"items":["A"]}`), []byte(testID), []byte(nil), "", uint8(0))
	f.Add([]byte(`{"id":"`+testID+`"}`), []byte(""), []byte(nil), "id", uint8(1))
	f.Add([]byte("{\"a\":\"\x00\"}"), []byte(testID), []byte(nil), "", uint8(0))
	f.Add([]byte(`{"a":"\u0000"}`), []byte(testID), []byte(nil), "", uint8(0))
	f.Add([]byte(`{"user_id":1}`), []byte(nil), []byte(testID), "", uint8(2))
	f.Add([]byte("\x00\xff"), []byte(nil), []byte(nil), "", uint8(7))
	f.Add([]byte(`{"id":"`+testID+`","a":"\u0000","b":{"c":[1,{"d":2}]}`), []byte(nil), []byte(nil), "id", uint8(1))
	sources := []IDSource{IDFromHeader, IDFromField, IDFromKey, IDFromOffset}
	formats := []Format{FormatJSON, FormatBytes}
	f.Fuzz(func(t *testing.T, value, id, key []byte, field string, mode uint8) {
		cfg := DecodeConfig{IDSource: sources[mode%4], Format: formats[mode/4%2], MaxBytes: 1 << 16}
		if cfg.IDSource == IDFromField {
			cfg.IDField = field
		}
		r := &kgo.Record{Topic: "t", Value: value, Key: key, Headers: []kgo.RecordHeader{{Key: HeaderEventID, Value: id}}}
		ev, err := Decode(r, cfg)
		if err != nil {
			if _, ok := err.(*DecodeError); !ok {
				t.Fatalf("error is %T, want *DecodeError", err)
			}
			return
		}
		if cfg.Validate() != nil {
			t.Fatalf("accepted a record under an invalid config %+v", cfg)
		}
		if cfg.Format == FormatJSON && (strings.ContainsRune(string(ev.Value), 0) || strings.Contains(string(ev.Value), `\u0000`)) {
			t.Fatalf("accepted a value Postgres cannot store: %q", ev.Value)
		}
		if len(ev.ID.String()) != 36 {
			t.Fatalf("accepted id %v", ev.ID)
		}
	})
}
