package bench

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func renderOne(t *testing.T, src string, seed uint64) map[string]any {
	t.Helper()
	tm, err := ParseTemplate([]byte(src))
	if err != nil {
		t.Fatalf("ParseTemplate(%s): %v", src, err)
	}
	id := uuid.MustParse("7f8a0000-0000-4000-8000-0000000000a1")
	now := time.Date(2026, 12, 5, 21, 0, 0, 0, time.UTC)
	out := tm.render(nil, rand.New(rand.NewPCG(seed, 1)), id, 42, now)
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(string(out)))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("render of %s = %s: not JSON: %v", src, out, err)
	}
	return m
}

func TestTemplateFunctions(t *testing.T) {
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	tests := []struct {
		name, tmpl string
		check      func(v any) bool
	}{
		{"uuid", `{"v":"{{uuid}}"}`, func(v any) bool { s, ok := v.(string); return ok && uuidRE.MatchString(s) }},
		{"event_id", `{"v":"{{event_id}}"}`, func(v any) bool { return v == "7f8a0000-0000-4000-8000-0000000000a1" }},
		{"seq", `{"v":"{{seq}}"}`, func(v any) bool { return v == json.Number("42") }},
		{"int", `{"v":"{{int -5 5}}"}`, func(v any) bool {
			n, ok := v.(json.Number)
			i, err := n.Int64()
			return ok && err == nil && i >= -5 && i <= 5
		}},
		{"int one value", `{"v":"{{int 7 7}}"}`, func(v any) bool { return v == json.Number("7") }},
		{"decimal", `{"v":"{{decimal 0.01 999.99 2}}"}`, func(v any) bool {
			n, ok := v.(json.Number)
			f, err := strconv.ParseFloat(string(n), 64)
			return ok && err == nil && f >= 0.01 && f <= 999.99 && regexp.MustCompile(`^\d+\.\d\d$`).MatchString(string(n))
		}},
		{"decimal rounds MIN up", `{"v":"{{decimal 0.001 0.019 2}}"}`, func(v any) bool { return v == json.Number("0.01") }},
		{"decimal scale 0", `{"v":"{{decimal 3 3 0}}"}`, func(v any) bool { return v == json.Number("3") }},
		{"decimal negative", `{"v":"{{decimal -1 -1 3}}"}`, func(v any) bool { return v == json.Number("-1.000") }},
		{"choice escaped quotes", `{"v":"{{choice \"EUR\" \"USD\"}}"}`, func(v any) bool { return v == "EUR" || v == "USD" }},
		{"choice single quotes", `{"v":"{{choice 'a b' 'c'}}"}`, func(v any) bool { return v == "a b" || v == "c" }},
		{"choice numbers", `{"v":"{{choice 1 2.5}}"}`, func(v any) bool { return v == json.Number("1") || v == json.Number("2.5") }},
		{"now", `{"v":"{{now}}"}`, func(v any) bool { return v == "2026-12-05T21:00:00Z" }},
		{"timestamp", `{"v":"{{timestamp 2026-01-01 2026-01-02T00:00:00Z}}"}`, func(v any) bool {
			s, _ := v.(string)
			ts, err := time.Parse(time.RFC3339Nano, s)
			return err == nil && !ts.Before(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) && !ts.After(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
		}},
		{"string of a number", `{"v":"{{string decimal 12.5 12.5 2}}"}`, func(v any) bool { return v == "12.50" }},
		{"within a string", `{"v":"acct-{{int 3 3}}/{{choice 'x\"y'}}"}`, func(v any) bool { return v == `acct-3/x"y` }},
		{"nested and multi-line", "{\n  \"a\": {\"b\": [\"{{int 1 1}}\", \"lit\"]},\n  \"v\": \"{{seq}}\"\n}", func(v any) bool { return v == json.Number("42") }},
		{"no placeholder", `{"v":"plain"}`, func(v any) bool { return v == "plain" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := range uint64(20) {
				m := renderOne(t, tt.tmpl, seed)
				if !tt.check(m["v"]) {
					t.Fatalf("seed %d: v = %#v: not what %s makes", seed, m["v"], tt.tmpl)
				}
			}
		})
	}
}

func TestTemplateSpreads(t *testing.T) {
	tm, err := ParseTemplate([]byte(`{"v":"{{int 1 4}}"}`))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{}
	for range 200 {
		seen[string(tm.render(nil, rng, uuid.Nil, 1, time.Time{}))] = true
	}
	if len(seen) != 4 {
		t.Fatalf("200 renders of int 1 4 gave %d distinct values, want 4: %v", len(seen), seen)
	}
}

func TestTemplateErrors(t *testing.T) {
	tests := []struct {
		name, tmpl string
		line, col  int
		fn, msgHas string
	}{
		{"unknown function", `{"a": "{{uid}}"}`, 1, 8, "uid", "unknown function"},
		{"int arity", "{\n  \"a\": \"{{int 1}}\"\n}", 2, 9, "int", "takes 2 arguments"},
		{"int not a number", `{"a":"{{int 1 ten}}"}`, 1, 7, "int", "ten, is not an integer"},
		{"int empty range", `{"a":"{{int 9 1}}"}`, 1, 7, "int", "MIN 9 is above MAX 1"},
		{"decimal scale", `{"a":"{{decimal 1 2 x}}"}`, 1, 7, "decimal", "SCALE x"},
		{"decimal no value", `{"a":"{{decimal 0.001 0.009 2}}"}`, 1, 7, "decimal", "no decimal with 2 digits"},
		{"decimal empty", `{"a":"{{decimal 2 1 2}}"}`, 1, 7, "decimal", "MIN 2 is above MAX 1"},
		{"choice none", `{"a":"{{choice}}"}`, 1, 7, "choice", "at least one argument"},
		{"choice bare word", `{"a":"{{choice EUR}}"}`, 1, 7, "choice", "neither a quoted string nor a number"},
		{"choice unclosed quote", `{"a":"{{choice 'EUR}}"}`, 1, 7, "", "without its closing '"},
		{"timestamp bad", `{"a":"{{timestamp yesterday 2026-01-01}}"}`, 1, 7, "timestamp", "yesterday"},
		{"timestamp order", `{"a":"{{timestamp 2026-02-01 2026-01-01}}"}`, 1, 7, "timestamp", "is after"},
		{"now with argument", `{"a":"{{now 1}}"}`, 1, 7, "now", "takes 0 arguments"},
		{"string alone", `{"a":"{{string}}"}`, 1, 7, "string", "names no function"},
		{"empty placeholder", `{"a":"{{ }}"}`, 1, 7, "", "empty placeholder"},
		{"unclosed", "{\"a\":\n \"{{int 1 2\"}", 2, 3, "", "without a closing }}"},
		{"outside a string", `{"a": {{int 1 2}}}`, 1, 7, "", "outside a JSON string"},
		{"not JSON", "{\"a\": \"{{int 1 2}}\",\n \"b\": }", 2, 7, "", "not JSON"},
		{"empty", ``, 1, 1, "", "not JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTemplate([]byte(tt.tmpl))
			var te *TemplateError
			if !errors.As(err, &te) {
				t.Fatalf("ParseTemplate(%q) = %v, want a *TemplateError", tt.tmpl, err)
			}
			if te.Line != tt.line || te.Column != tt.col || te.Func != tt.fn || !strings.Contains(te.Msg, tt.msgHas) {
				t.Fatalf("ParseTemplate(%q) = line %d col %d func %q msg %q; want line %d col %d func %q msg containing %q",
					tt.tmpl, te.Line, te.Column, te.Func, te.Msg, tt.line, tt.col, tt.fn, tt.msgHas)
			}
			if !strings.Contains(err.Error(), "line "+strconv.Itoa(tt.line)+" column "+strconv.Itoa(tt.col)) {
				t.Fatalf("error %q does not name line %d column %d", err, tt.line, tt.col)
			}
		})
	}
}

func TestSampleAndGenerate(t *testing.T) {
	if _, err := ParseSample([]byte("{\"a\":1}\n\n{\"a\":\n")); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("a sample with a bad line 3: err = %v, want it named", err)
	}
	if _, err := ParseSample([]byte("\n  \n")); err == nil {
		t.Fatal("an empty sample: no error")
	}
	p, err := ParseSample([]byte("{\"a\":1}\n{\"a\":2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Generate(p, GenerateConfig{Events: 1000, Duplicates: 0.3, Partitions: 4, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Events) != 1000 || len(s.Records) != 1300 || s.Redeliveries() != 300 {
		t.Fatalf("events %d records %d redeliveries %d, want 1000, 1300, 300", len(s.Events), len(s.Records), s.Redeliveries())
	}
	first := map[int]int{} // event -> index of its first delivery
	ids := map[uuid.UUID]bool{}
	other := 0
	for i, r := range s.Records {
		if !r.Redelivery {
			first[r.Event] = i
			ids[s.Events[r.Event].ID] = true
			if r.Partition != s.Events[r.Event].Partition {
				t.Fatalf("record %d: first delivery on partition %d, event's is %d", i, r.Partition, s.Events[r.Event].Partition)
			}
			continue
		}
		f, ok := first[r.Event]
		if !ok || f > i {
			t.Fatalf("record %d: a redelivery of event %d before its first delivery", i, r.Event)
		}
		if r.Partition != s.Events[r.Event].Partition {
			other++
		}
	}
	if len(ids) != 1000 {
		t.Fatalf("%d distinct ids, want 1000", len(ids))
	}
	if other == 0 || other == 300 {
		t.Fatalf("%d of 300 redeliveries on another partition, want some but not all", other)
	}
	if string(s.Events[0].Value) != `{"a":1}` || string(s.Events[1].Value) != `{"a":2}` || string(s.Events[2].Value) != `{"a":1}` {
		t.Fatalf("sample lines not cycled: %s %s %s", s.Events[0].Value, s.Events[1].Value, s.Events[2].Value)
	}
	// OtherPartition places that share of the redeliveries elsewhere.
	for _, share := range []float64{0, 1} {
		s, err := Generate(p, GenerateConfig{Events: 1000, Duplicates: 0.3, Partitions: 4, Seed: 7, OtherPartition: &share})
		if err != nil {
			t.Fatal(err)
		}
		other := 0
		for _, r := range s.Records {
			if r.Redelivery && r.Partition != s.Events[r.Event].Partition {
				other++
			}
		}
		if want := int(share * 300); other != want {
			t.Errorf("OtherPartition %g: %d of 300 redeliveries on another partition, want %d", share, other, want)
		}
	}
	over := 1.5
	for _, bad := range []GenerateConfig{{Events: 0, Partitions: 1}, {Events: 1, Duplicates: 1.5, Partitions: 1}, {Events: 1},
		{Events: 1, Partitions: 1, OtherPartition: &over}} {
		if _, err := Generate(p, bad); err == nil {
			t.Fatalf("Generate(%+v): no error", bad)
		}
	}
}
