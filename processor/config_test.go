package processor_test

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/processor"
)

func TestValidateFetchSizes(t *testing.T) {
	base := processor.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, Group: "g"}
	for _, tc := range []struct {
		name            string
		maxBytes, parts int
		want            string // "" = valid
	}{
		{"defaults", 0, 0, ""},
		{"partition share equal to the response", 1 << 20, 1 << 20, ""},
		{"response below 1 KiB", 512, 0, "FetchMaxBytes 512 is not 1024..104857600"},
		{"response over the broker read limit", processor.MaxFetchBytes + 1, 0, "FetchMaxBytes 104857601"},
		{"partition share over the response", 2 << 20, 4 << 20, "FetchMaxPartitionBytes 4194304 is not 1024..FetchMaxBytes (2097152)"},
		{"partition share over the default response", 0, 32 << 20, "FetchMaxPartitionBytes 33554432 is not 1024..FetchMaxBytes (16777216)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.FetchMaxBytes, c.FetchMaxPartitionBytes = tc.maxBytes, tc.parts
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
