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
