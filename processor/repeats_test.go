package processor

import (
	"testing"
	"time"
)

func TestRepeatsHoldBackALineSaidAgain(t *testing.T) {
	var r repeats
	t0 := time.Unix(1000, 0)
	if ok, held := r.allow("a", t0); !ok || held != 0 {
		t.Fatalf("first line: %v, %d", ok, held)
	}
	for i := range 5 {
		if ok, _ := r.allow("a", t0.Add(time.Duration(i+1)*time.Second)); ok {
			t.Fatalf("the same line %ds later was logged", i+1)
		}
	}
	if ok, _ := r.allow("b", t0.Add(time.Second)); !ok {
		t.Fatal("another line was held back")
	}
	if ok, held := r.allow("a", t0.Add(repeatWindow)); !ok || held != 5 {
		t.Fatalf("the line a window later: %v, held %d; want logged, 5 held", ok, held)
	}
	for i := range maxRepeatKeys + 1 {
		r.allow(string(rune('c'+i)), t0)
	}
	if len(r.last) > maxRepeatKeys {
		t.Fatalf("%d lines remembered, want at most %d", len(r.last), maxRepeatKeys)
	}
}
