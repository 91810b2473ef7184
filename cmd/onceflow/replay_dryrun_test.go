package main

import (
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// replay --dry-run counts the poison a re-read will dead-letter again as
// such, not as pairs to apply: an event the handlers' parse refuses
// (REFUSED), an undecodable record (UNDECODABLE); and it says what only
// running the handlers tells.
func TestReplayDryRunCountsPoison(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	s, err := orders.Generate(3, 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{}
	for _, m := range s.Messages {
		recs = append(recs, wire.NewRecord("orders", m.ID, m.Value))
	}
	notOrder := uuid.New()
	recs = append(recs, wire.NewRecord("orders", notOrder, []byte(`{"user_id":1,"items":[]}`)), // offset 3
		&kgo.Record{Topic: "orders", Value: []byte(`{"user_id":1,"items":["A"]}`)}) // offset 4: no event_id
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	// The group has read all five: three applied, two dead letters.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.sink_offsets (consumer_group, topic, partition, next_offset, epoch) VALUES ('g', 'orders', 0, 5, 3)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Messages {
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.processed_events (event_id, handler, bus) VALUES ($1, 'emailHandler', 'kafka')`, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.dead_letters (consumer_group, topic, partition, "offset", event_id, reason)
VALUES ('g', 'orders', 0, 3, $1, 'rejected: not an order: items is empty'), ('g', 'orders', 0, 4, NULL, 'no event_id header')`, notOrder); err != nil {
		t.Fatal(err)
	}

	out, err := runCLI(t, io.Discard, "replay", "--dsn", sinktest.DSN(t), "--schema", schema, "--brokers", strings.Join(seeds, ","),
		"--topics", "orders", "--group", "g", "--handlers", "emailHandler", "--to-start", "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	t.Logf("dry run:\n%s", out)
	// RECORDS UNDECODABLE HANDLER APPLY SKIP CONFLICT REFUSED DL-BEFORE
	if !regexp.MustCompile(`(?m)^total +5 +1 +emailHandler +0 +3 +0 +1 +0\s*$`).MatchString(out) {
		t.Errorf("dry run totals: want 5 records, 1 undecodable, and for emailHandler 0 to apply, 3 skipped, 1 refused:\n%s", out)
	}
	if !strings.Contains(out, "only known by running it") {
		t.Errorf("dry run output does not say what it cannot know:\n%s", out)
	}
	if !strings.Contains(out, "group members: none") {
		t.Errorf("dry run output does not say the group has no member:\n%s", out)
	}
	// An instance id no member holds: the real run would refuse it; the
	// dry run says so, and still counts.
	out, err = runCLI(t, io.Discard, "replay", "--dsn", sinktest.DSN(t), "--schema", schema, "--brokers", strings.Join(seeds, ","),
		"--topics", "orders", "--group", "g", "--handlers", "emailHandler", "--to-start", "--dry-run", "--remove-static-members", "ghost")
	if err != nil {
		t.Fatalf("dry run --remove-static-members ghost: %v\n%s", err, out)
	}
	if !strings.Contains(out, "\nREFUSED (") || !strings.Contains(out, "no static member with instance id ghost") || !strings.Contains(out, "total") {
		t.Errorf("dry run --remove-static-members ghost does not count and say the id is no member's:\n%s", out)
	}
}
