package processor

import (
	"testing"
	"time"
)

// A zero HeartbeatInterval is a third of the session, at most 3s: a
// classic member heartbeats three times per session however short it is.
func TestHeartbeatDerivedFromSession(t *testing.T) {
	for _, tc := range []struct {
		session, want time.Duration
	}{
		{45 * time.Second, 3 * time.Second},
		{10 * time.Second, 3 * time.Second},
		{9 * time.Second, 3 * time.Second},
		{6 * time.Second, 2 * time.Second},
		{3 * time.Second, time.Second},
		{600 * time.Millisecond, 200 * time.Millisecond},
	} {
		c := Config{SessionTimeout: tc.session}.withDefaults()
		if c.HeartbeatInterval != tc.want {
			t.Errorf("session %v: heartbeat interval %v, want %v", tc.session, c.HeartbeatInterval, tc.want)
		}
	}
	if c := (Config{SessionTimeout: 3 * time.Second, HeartbeatInterval: 500 * time.Millisecond}).withDefaults(); c.HeartbeatInterval != 500*time.Millisecond {
		t.Errorf("a heartbeat interval set became %v, want 500ms", c.HeartbeatInterval)
	}
}
