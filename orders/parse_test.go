package orders

import (
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
