package wire

import "testing"

func TestHasNULEscape(t *testing.T) {
	for _, tc := range []struct {
		name string
		json string
		want bool
	}{
		{"none", `{"memo":"C:\\dir"}`, false},
		{"escape", `{"items":["A\u0000B"]}`, true},
		{"in a key", `{"k\u0000":1}`, true},
		{"escaped backslash then u0000", `{"memo":"C:\\u0000dir"}`, false},
		{"two escaped backslashes then u0000", `{"memo":"C:\\\\u0000dir"}`, false},
		{"escaped backslash then the escape", `{"memo":"C:\\\u0000dir"}`, true},
		{"first not, second is", `{"a":"\\u0000","b":"\u0000"}`, true},
		{"at the start", `\u0000`, true},
		{"other escape", `{"a":"\u0001"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := HasNULEscape([]byte(tc.json)); got != tc.want {
				t.Errorf("HasNULEscape(%s) = %v, want %v", tc.json, got, tc.want)
			}
		})
	}
}
