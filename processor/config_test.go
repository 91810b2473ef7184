package processor_test

import (
	"strings"
	"testing"
	"time"

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

func TestValidateGroupProtocol(t *testing.T) {
	base := processor.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, Group: "g"}
	for _, tc := range []struct {
		name       string
		protocol   processor.GroupProtocol
		instanceID string
		want       []string // empty: valid
	}{
		{"defaults", "", "", nil},
		{"consumer, static", processor.ConsumerProtocol, "onceflow-0", nil},
		{"classic, static", processor.ClassicProtocol, "a.b_c-9", nil},
		{"unknown protocol", "cooperative", "", []string{`GroupProtocol "cooperative" is not "classic" or "consumer"`}},
		{"instance id with a space", "", "pod 0", []string{`InstanceID "pod 0" has ' '`}},
		{"instance id dot", "", "..", []string{`InstanceID ".." may not be . or ..`}},
		{"instance id too long", "", strings.Repeat("x", 250), []string{"is 250 characters, more than 249"}},
		{"both wrong, both said", "v2", "a/b", []string{`GroupProtocol "v2"`, `InstanceID "a/b" has '/'`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.GroupProtocol, c.InstanceID = tc.protocol, tc.instanceID
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want an error containing %q", err, w)
				}
			}
			if _, nerr := processor.New(c, nil); nerr == nil || !strings.Contains(nerr.Error(), tc.want[0]) {
				t.Errorf("New() = %v, want the same problems as Validate", nerr)
			}
		})
	}
}

func TestValidateHeartbeatInterval(t *testing.T) {
	base := processor.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, Group: "g"}
	for _, tc := range []struct {
		name               string
		session, heartbeat time.Duration
		want               string // "" = valid
	}{
		{"defaults", 0, 0, ""},
		{"derived from a short session", 3 * time.Second, 0, ""},
		{"derived from a very short session", 300 * time.Millisecond, 0, ""},
		{"a third of the session", 3 * time.Second, time.Second, ""},
		{"franz-go's default within a 3s session", 3 * time.Second, 3 * time.Second,
			"HeartbeatInterval 3s is above a third of SessionTimeout 3s (1s)"},
		{"above a third of the default session", 0, 4 * time.Second,
			"HeartbeatInterval 4s is above a third of SessionTimeout 10s (3.333333333s)"},
		{"negative", 0, -time.Second, "HeartbeatInterval -1s is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.SessionTimeout, c.HeartbeatInterval = tc.session, tc.heartbeat
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
