package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/onceflow/onceflow/deploy"
	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// scrapeFamilies reads url's metrics, or returns the error.
func scrapeFamilies(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// exported reports whether a series name is on /metrics: a family, or a
// histogram's or summary's _bucket, _sum or _count series.
func exported(fams map[string]*dto.MetricFamily, name string) bool {
	if fams[name] != nil {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if f := fams[base]; ok && f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
			return suffix != "_bucket" || f.GetType() == dto.MetricType_HISTOGRAM
		}
	}
	return false
}

// servedOnly are the series only `onceflow serve` exports: it runs the
// outbox's relay, `run` does not.
var servedOnly = map[string]bool{"onceflow_outbox_oldest_pending_age_seconds": true}

// checkReadExported fails for each series an alert rule or a dashboard
// query reads that fams (scraped from url) lacks, leaving out those in
// skip; an expression that reads no onceflow series fails too.
func checkReadExported(t *testing.T, url string, fams map[string]*dto.MetricFamily, skip map[string]bool) {
	t.Helper()
	rules, err := deploy.Rules()
	if err != nil {
		t.Fatal(err)
	}
	dash, err := deploy.DashboardExprs()
	if err != nil {
		t.Fatal(err)
	}
	var exprs []deploy.Expr
	for _, r := range rules {
		exprs = append(exprs, deploy.Expr{Where: "alert " + r.Alert, Expr: r.Expr})
	}
	exprs = append(exprs, dash...)
	checked := 0
	for _, e := range exprs {
		names := deploy.MetricNames(e.Expr)
		if len(names) == 0 {
			t.Errorf("%s reads no onceflow series: %s", e.Where, e.Expr)
		}
		for _, n := range names {
			if skip[n] {
				continue
			}
			checked++
			if !exported(fams, n) {
				t.Errorf("%s reads %s, which a running member does not export", e.Where, n)
			}
		}
	}
	t.Logf("%d expressions, %d series names checked against %s", len(exprs), checked, url)
}

// A running member (`onceflow run`, kfake and Postgres, a dead-letter
// topic, the default dedup retention) exports every series the alert
// rules and the dashboard read, but the outbox's; and once it has applied
// every record, each of its partitions exports its time lag at 0, its
// committed offset at the partition's end, and not retrying, and nothing
// waits for the dead-letter topic.
func TestRulesAndDashboardReadExportedMetrics(t *testing.T) {
	t.Setenv("ONCEFLOW_KAFKA_DEAD_LETTER_TOPIC", "orders.dlq")
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_deploy_")
	stream, err := orders.Generate(300, 0, 17)
	if err != nil {
		t.Fatal(err)
	}
	const partitions = 3
	c := ordersCluster(t, partitions, stream)
	addr := freeAddr(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"run", "--brokers", c.ListenAddrs()[0], "--topics", "orders", "--group", "deploy-test",
		"--dsn", dsn, "--schema", schema, "--http-addr", addr, "--log-level", "warn"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("run did not drain within 30s of cancel")
		}
	}()

	// Wait until every record is applied and each partition is reported.
	url := "http://" + addr + "/metrics"
	var fams map[string]*dto.MetricFamily
	deadline := time.Now().Add(60 * time.Second)
	for {
		fams, err = scrapeFamilies(url)
		var committed float64
		for _, m := range fams["onceflow_partition_committed_offset"].GetMetric() {
			committed += m.GetGauge().GetValue()
		}
		if err == nil && committed >= float64(len(stream.Messages)) && len(fams["onceflow_partition_time_lag_seconds"].GetMetric()) == partitions &&
			fams["onceflow_dedup_slices"] != nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 60s: committed offsets sum to %v of %d records, %d partitions report a time lag (scrape error: %v)",
				committed, len(stream.Messages), len(fams["onceflow_partition_time_lag_seconds"].GetMetric()), err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	checkReadExported(t, url, fams, servedOnly)

	// Caught up: every partition at 0, its offset at its end.
	for _, m := range fams["onceflow_partition_time_lag_seconds"].GetMetric() {
		if v := m.GetGauge().GetValue(); v != 0 {
			t.Errorf("onceflow_partition_time_lag_seconds%s = %v once caught up, want 0", labelsOf(m), v)
		}
	}
	for _, m := range fams["onceflow_partition_retrying"].GetMetric() {
		if v := m.GetGauge().GetValue(); v != 0 {
			t.Errorf("onceflow_partition_retrying%s = %v, want 0", labelsOf(m), v)
		}
	}
	for _, m := range fams["onceflow_ready"].GetMetric() {
		if v := m.GetGauge().GetValue(); v != 1 {
			t.Errorf("onceflow_ready%s = %v while consuming, want 1", labelsOf(m), v)
		}
	}
	if n := len(fams["onceflow_ready"].GetMetric()); n != 2 {
		t.Errorf("onceflow_ready has %d checks, want 2 (postgres, kafka)", n)
	}
	for _, name := range []string{"onceflow_dead_letters_oldest_unpublished_age_seconds", "onceflow_dedup_rotation_overdue_seconds",
		"onceflow_dedup_drop_overdue_seconds", "onceflow_dedup_drop_held"} {
		for _, m := range fams[name].GetMetric() {
			if v := m.GetGauge().GetValue(); v != 0 {
				t.Errorf("%s%s = %v on a member caught up with a fresh schema, want 0", name, labelsOf(m), v)
			}
		}
	}
}

// `onceflow serve` (its API, the outbox relay, the consumer, the dedup
// retention, a dead-letter topic) exports every series the alert rules
// and the dashboard read, the outbox's included; once its one event is
// published the outbox's oldest pending row is 0 seconds old.
func TestRulesAndDashboardReadServedMetrics(t *testing.T) {
	s := startSeedServer(t, func(c *config.Config, _ string) { c.Kafka.DeadLetterTopic = "orders.dlq" })
	if code, _, body := s.post(uuid.NewString(), `{"user_id":1,"items":["A"]}`); code/100 != 2 {
		t.Fatalf("POST /events-outbox: %d %v", code, body)
	}
	s.drained()
	url := s.base + "/metrics"
	var fams map[string]*dto.MetricFamily
	deadline := time.Now().Add(60 * time.Second)
	for {
		var err error
		fams, err = scrapeFamilies(url)
		if err == nil && fams["onceflow_dedup_slices"] != nil && len(fams["onceflow_partition_time_lag_seconds"].GetMetric()) > 0 &&
			len(fams["onceflow_outbox_oldest_pending_age_seconds"].GetMetric()) == 1 &&
			fams["onceflow_outbox_oldest_pending_age_seconds"].GetMetric()[0].GetGauge().GetValue() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 60s: no retention step, partition or published outbox on %s (scrape error: %v)", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkReadExported(t, url, fams, nil)
}

func labelsOf(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.GetLabel() {
		fmt.Fprintf(&b, "%s=%q,", l.GetName(), l.GetValue())
	}
	return "{" + strings.TrimSuffix(b.String(), ",") + "}"
}
