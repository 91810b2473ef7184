package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
)

const sampleLog = `time=2026-12-02T18:55:02.000Z level=INFO msg="partitions assigned" topic=orders partitions="[0 3]"
time=2026-12-02T18:55:02.100Z level=INFO msg=dedup.skip step=dedup.skip event_id=87e1da46-aa83-4553-846e-bf6bc3fcbe4d handler=emailHandler topic=orders partition=3 offset=2541
time=2026-12-02T18:55:03.000Z level=WARN msg="batch failed; retrying" topic=orders partition=3 offset=2540 batch_size=500 attempt=1 err="claim events: unexpected EOF"
time=2026-12-02T18:55:04.000Z level=WARN msg="batch failed; retrying" topic=orders partition=3 offset=2540 batch_size=500 attempt=2 err="claim events: unexpected EOF"
time=2026-12-02T18:55:05.000Z level=INFO msg="resuming from the offset stored in postgres" topic=orders partition=3 offset=4437 kafka_committed=2540
time=2026-12-02T18:55:06.000Z level=WARN msg="batch failed; retrying" topic=orders partition=1 offset=2540 batch_size=500 attempt=1 err=x
time=2026-12-02T18:55:07.000Z level=INFO msg="partitions assigned" topic=orders partitions=[1]
`

func TestGrepLogs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m1.2.log")
	if err := os.WriteFile(path, []byte(sampleLog), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := grepLogs([]string{path}, aboutOffsets(3, 2000, 3000))
	if err != nil {
		t.Fatal(err)
	}
	// The two retries collapse into one line; the resume line is kept for
	// its kafka_committed offset though its offset is outside the range;
	// the dedup.skip line and partition 1's line are not about the offsets.
	if len(got) != 2 || got[0].count != 2 || !strings.Contains(got[1].text, "resuming") || got[0].member != "m1.2" {
		t.Fatalf("got %+v", got)
	}
	if got[0].last.Sub(got[0].at).Seconds() != 1 {
		t.Fatalf("collapsed line spans %v..%v, want one second", got[0].at, got[0].last)
	}
	ids, err := grepLogs([]string{path}, aboutEvents(evA, uuid.MustParse("87e1da46-aa83-4553-846e-bf6bc3fcbe4d")))
	if err != nil || len(ids) != 1 || !strings.Contains(ids[0].text, "dedup.skip") {
		t.Fatalf("lines about the event: %+v, %v", ids, err)
	}
	// The same line in two members' logs collapses into one, from both.
	other := filepath.Join(dir, "m2.1.log")
	if err := os.WriteFile(other, []byte(sampleLog), 0o644); err != nil {
		t.Fatal(err)
	}
	both, err := grepLogs([]string{path, other}, aboutOffsets(3, 2000, 3000))
	if err != nil || len(both) != 2 || both[0].count != 4 || both[0].members != 2 {
		t.Fatalf("lines of two members: %+v, %v", both, err)
	}
	own, err := owners([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	if own[0].member != "m1.2" || own[3].member != "m1.2" || own[1].at.Second() != 7 {
		t.Fatalf("owners %+v", own)
	}
	if _, ok := own[2]; ok {
		t.Fatalf("partition 2 was never assigned, got %+v", own[2])
	}
}
