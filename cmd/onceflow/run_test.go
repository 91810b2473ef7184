package main

import (
	"bytes"
	"context"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// `onceflow run` consumes a topic with redeliveries, applies every event
// once, and returns nil when its context ends (SIGTERM, via main).
func TestRunConsumesAndDrains(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_run_")

	stream, err := orders.Generate(2000, 0.5, 9)
	if err != nil {
		t.Fatal(err)
	}
	c := ordersCluster(t, 3, stream)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := newRoot()
	root.SetOut(io.Discard)
	var stderr bytes.Buffer
	root.SetErr(&stderr)
	root.SetArgs([]string{"run", "--brokers", c.ListenAddrs()[0], "--topics", "orders", "--group", "run-test",
		"--dsn", dsn, "--schema", schema, "--http-addr", "127.0.0.1:0", "--log-level", "warn"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int64
		_ = pool.QueryRow(t.Context(), `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets`).Scan(&n)
		if n >= int64(len(stream.Messages)) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("run committed %d of %d records in 60s", n, len(stream.Messages))
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not drain within 30s of cancel")
	}
	rep, err := orders.Check(t.Context(), pool, schema, stream.Unique)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}

// `onceflow run` with a database that does not exist ends at once with an
// error naming the step: waiting cannot cure a configuration error.
func TestRunFailsOnUnknownDatabase(t *testing.T) {
	u, err := url.Parse(sinktest.DSN(t))
	if err != nil {
		t.Fatalf("test DSN is not a URL: %v", err)
	}
	u.Path = "/onceflow_no_such_database"
	_, err = runCLI(t, io.Discard, "run", "--brokers", "127.0.0.1:1", "--dsn", u.String(), "--http-addr", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "connect: postgres at") {
		t.Errorf("run with an unknown database: %v, want an error naming the step", err)
	}
}

// ordersCluster is a kfake cluster with topics orders (partitions) and
// orders.dlq, holding stream's messages; closed at the test's end.
func ordersCluster(t *testing.T, partitions int32, stream orders.Stream) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "orders"), kfake.SeedTopics(1, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(stream.Messages))
	for i, m := range stream.Messages {
		recs[i] = wire.NewRecord("orders", m.ID, m.Value)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return c
}
