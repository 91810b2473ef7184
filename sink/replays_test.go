package sink_test

import (
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A rewind is in progress until its group's stored offset is back where
// the rewind started, and for at most `within`.
func TestReplayInProgress(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	inProgress := func() string {
		t.Helper()
		r, err := sink.ReplayInProgress(ctx, pool, schema, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := inProgress(); r != "" {
		t.Fatalf("no replay: %q", r)
	}
	exec(`INSERT INTO ` + schema + `.sink_offsets (consumer_group, topic, partition, next_offset) VALUES ('g', 'orders', 0, 10)`)
	exec(`INSERT INTO ` + schema + `.sink_replays (consumer_group, topic, partition, from_offset, to_offset) VALUES ('g', 'orders', 0, 50, 0)`)
	if r := inProgress(); !strings.Contains(r, "group g") || !strings.Contains(r, "orders/0 is at offset 10 of 50") {
		t.Fatalf("a replay at 10 of 50: %q", r)
	}
	exec(`UPDATE ` + schema + `.sink_offsets SET next_offset = 50`)
	if r := inProgress(); r != "" {
		t.Fatalf("a replay caught up: %q", r)
	}
	exec(`UPDATE ` + schema + `.sink_offsets SET next_offset = 20`)
	exec(`UPDATE ` + schema + `.sink_replays SET created_at = now() - interval '2 hours'`)
	if r := inProgress(); r != "" {
		t.Fatalf("a replay older than within: %q", r)
	}
}
