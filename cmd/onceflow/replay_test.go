package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// replay --dry-run counts what a rewind would apply and changes nothing;
// replay then rewinds sink_offsets with a new epoch, and Kafka's offsets.
func TestReplayCommand(t *testing.T) {
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
	s, err := orders.Generate(5, 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Messages {
		if err := cl.ProduceSync(ctx, wire.NewRecord("orders", m.ID, m.Value)).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	// The group has applied all five with emailHandler only.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.sink_offsets (consumer_group, topic, partition, next_offset, epoch) VALUES ('g', 'orders', 0, 5, 3)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Messages {
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.processed_events (event_id, handler, bus) VALUES ($1, 'emailHandler', 'kafka')`, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"replay", "--dsn", sinktest.DSN(t), "--schema", schema, "--brokers", strings.Join(seeds, ","),
		"--topics", "orders", "--group", "g", "--handlers", "emailHandler,recommenderHandler"}

	out, err := runCLI(t, io.Discard, append(args, "--backfill", "recommenderHandler", "--dry-run")...)
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	t.Logf("dry run:\n%s", out)
	for _, want := range []string{"dedup horizon: 168h0m0s (dedup.retention)", "orders  0          5     0   5", "total", "recommenderHandler  5      0     0", "emailHandler        0      5     0"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets`); n != 5 {
		t.Fatalf("the dry run moved sink_offsets to %d", n)
	}

	if _, err := runCLI(t, io.Discard, append(args, "--to-start", "--to-time", "1h")...); err == nil {
		t.Error("two targets were accepted")
	}
	if _, err := runCLI(t, io.Discard, append(args, "--backfill", "nosuchHandler")...); err == nil || !strings.Contains(err.Error(), "not among the group's handlers") {
		t.Errorf("backfill of an unknown handler: err = %v", err)
	}

	out, err = runCLI(t, io.Discard, append(args, "--to-offset", "orders:0=2")...)
	if err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets`); n != 2 {
		t.Errorf("sink_offsets after the rewind = %d, want 2", n)
	}
	if n := sinktest.Count(t, pool, `SELECT epoch FROM `+schema+`.sink_offsets`); n != 4 {
		t.Errorf("epoch after the rewind = %d, want 4 (bumped, fencing any writer)", n)
	}
	got, err := kadm.NewClient(cl).FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := got.Lookup("orders", 0); !ok || o.At != 2 {
		t.Errorf("Kafka committed offset after the rewind = %+v, want 2", o)
	}
}
