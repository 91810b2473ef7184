package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The proxy's links and the cut toxic's drains must end with their
// connections.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBacklogIsAShare(t *testing.T) {
	for _, bad := range []string{"-1", "1", "1.5", "NaN"} {
		if _, err := parseFlags([]string{"-backlog", bad}); err == nil || !strings.Contains(err.Error(), "-backlog") {
			t.Errorf("-backlog %s: %v, want an error naming -backlog", bad, err)
		}
	}
	o, err := parseFlags([]string{"-short"})
	if err != nil || o.backlog != 0.5 {
		t.Errorf("-short: backlog %v (%v), want 0.5", o.backlog, err)
	}
	if o, err := parseFlags(nil); err != nil || o.backlog != 0.25 {
		t.Errorf("default: backlog %v (%v), want 0.25", o.backlog, err)
	}
}

// The members' group protocol is the one -group-protocol names, or the
// seed's: a seed replays with the protocol it ran with, and new seeds try
// both.
func TestGroupProtocolBySeed(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-seed", "28"}, "classic"},
		{[]string{"-seed", "29"}, "classic"},
		{[]string{"-seed", "60"}, "consumer"},
		{[]string{"-seed", "61"}, "consumer"},
		{[]string{"-seed", "28", "-group-protocol", "consumer"}, "consumer"},
		{[]string{"-seed", "29", "-group-protocol", "classic"}, "classic"},
		{[]string{"-seed", "61", "-group-protocol", "seed"}, "consumer"},
	} {
		o, err := parseFlags(tc.args)
		if err != nil || o.protocol != tc.want {
			t.Errorf("%v: protocol %q (%v), want %q", tc.args, o.protocol, err, tc.want)
		}
		if y := (memberConfig{GroupProtocol: o.protocol}).yaml("m1", 1); !strings.Contains(y, "\n  group_protocol: "+tc.want+"\n") {
			t.Errorf("%v: the member's configuration does not set group_protocol: %s:\n%s", tc.args, tc.want, y)
		}
	}
	if _, err := parseFlags([]string{"-group-protocol", "cooperative"}); err == nil || !strings.Contains(err.Error(), "-group-protocol") {
		t.Errorf("-group-protocol cooperative: %v, want an error naming -group-protocol", err)
	}
}
