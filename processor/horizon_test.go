package processor

import (
	"strings"
	"testing"
	"time"
)

func TestHorizonWarnings(t *testing.T) {
	retention := map[string]string{
		"week":    "604800000",
		"day":     "86400000",
		"forever": "-1",
		"odd":     "x",
		"huge":    "9223372036854775807",
	}
	ws := horizonWarnings([]string{"week", "day", "forever", "odd", "missing", "huge"}, retention, 48*time.Hour)
	got := map[string]string{}
	for _, w := range ws {
		got[w.topic] = w.msg
	}
	if len(got) != 3 {
		t.Fatalf("warnings for %v, want week, forever and huge", got)
	}
	if !strings.Contains(got["week"], "168h0m0s, longer than the dedup horizon") {
		t.Errorf("week: %q", got["week"])
	}
	if !strings.Contains(got["huge"], "forever") {
		t.Errorf("huge: %q", got["huge"])
	}
	if !strings.Contains(got["forever"], "forever") {
		t.Errorf("forever: %q", got["forever"])
	}
	if ws := horizonWarnings([]string{"day"}, retention, 24*time.Hour); len(ws) != 0 {
		t.Errorf("a topic keeping records as long as the horizon warned: %v", ws)
	}
}
