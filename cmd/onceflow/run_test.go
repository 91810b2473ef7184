package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// `onceflow run` consumes a topic with redeliveries, applies every event
// once, and returns nil when its context ends (SIGTERM, via main).
func TestRunConsumesAndDrains(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_run_")

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"), kfake.SeedTopics(1, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stream, err := orders.Generate(2000, 0.5, 9)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, len(stream.Messages))
	for i, m := range stream.Messages {
		recs[i] = wire.NewRecord("orders", m.ID, m.Value)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()

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
		if n >= int64(len(recs)) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("run committed %d of %d records in 60s", n, len(recs))
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

// While Postgres does not answer, `onceflow run` serves /readyz naming
// what it waits for, and returns nil when its context ends; a Postgres
// that does not know the database ends it at once with an error.
func TestRunWaitsForPostgres(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"run", "--brokers", "127.0.0.1:1", "--dsn", "postgres://u@127.0.0.1:1/db?connect_timeout=1",
		"--http-addr", addr, "--log-level", "error"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()

	var body map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			body = nil
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("/readyz while Postgres is down: %d %v, want 503", resp.StatusCode, body)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned while Postgres is down: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not served within 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waiting, _ := body["waiting_for"].(map[string]any)
	if k, _ := waiting["kafka"].(string); waiting["postgres"] == nil || !strings.Contains(k, "waiting for postgres") {
		t.Errorf("/readyz waiting_for = %v, want postgres and kafka (waiting for postgres)", waiting)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel while waiting: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of cancel")
	}

	u, err := url.Parse(sinktest.DSN(t))
	if err != nil {
		t.Skipf("test DSN is not a URL: %v", err)
	}
	u.Path = "/onceflow_no_such_database"
	_, err = runCLI(t, io.Discard, "run", "--brokers", "127.0.0.1:1", "--dsn", u.String(), "--http-addr", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "connect: postgres at") {
		t.Errorf("run with an unknown database: %v, want an error naming the step", err)
	}
}
