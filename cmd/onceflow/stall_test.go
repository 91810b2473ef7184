package main

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// partitionSeries is one partition's series on /metrics.
type partitionSeries struct {
	lag, timeLag, committed, retrying float64
	seen                              int // how many of the four were exported
}

func partitionOf(fams map[string]*dto.MetricFamily, partition string) partitionSeries {
	var s partitionSeries
	for name, v := range map[string]*float64{"onceflow_partition_lag": &s.lag, "onceflow_partition_time_lag_seconds": &s.timeLag,
		"onceflow_partition_committed_offset": &s.committed, "onceflow_partition_retrying": &s.retrying} {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == partition {
					*v = m.GetGauge().GetValue()
					s.seen++
				}
			}
		}
	}
	return s
}

// A real stall, seen on /metrics as the alerts read it: `onceflow run`
// with a SQL handler that updates one row per partition, and the test
// holding partition 0's row locked. Partition 0 has no poison record; its
// batch waits on the lock (not failing, not retrying). While it waits,
// its offset lag stays above 0, its committed offset does not move from
// one scrape to the next (OnceflowPartitionStalled), and its time lag is
// the age of its oldest record, an hour and more, growing between scrapes
// (OnceflowTimeLagHigh); partition 1 applies its records and reports 0.
// Once the lock is released, partition 0 catches up and every series
// returns to 0, its offset to its end.
func TestStallAndTimeLagOnMetrics(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_stall_")
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.per_partition (partition int PRIMARY KEY, applied bigint NOT NULL);
INSERT INTO `+schema+`.per_partition VALUES (0, 0), (1, 0)`); err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addr := freeAddr(t)
	config := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [ledger]
  group: stall-test
postgres:
  dsn: %s
  schema: %s
  tx_timeout: 10m
http:
  addr: %s
log:
  level: warn
batch:
  linger: 10ms
sql_handlers:
  - name: per_partition
    sql: |
      UPDATE %s.per_partition AS p SET applied = p.applied + e.n
      FROM (SELECT partition, count(*) AS n FROM events GROUP BY partition) AS e
      WHERE p.partition = e.partition
`, c.ListenAddrs()[0], dsn, schema, addr, schema))

	// The test holds partition 0's row: its batch will wait for it.
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background()) //nolint:errcheck
	if _, err := lock.Exec(ctx, `SELECT 1 FROM `+schema+`.per_partition WHERE partition = 0 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	// Five records a partition; partition 0's written an hour ago.
	const n = 5
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hourAgo := time.Now().Add(-time.Hour)
	var recs []*kgo.Record
	for p := range int32(2) {
		for range n {
			r := wire.NewRecord("ledger", uuid.New(), []byte(`{"amount":1}`))
			r.Partition = p
			if p == 0 {
				r.Timestamp = hourAgo
			}
			recs = append(recs, r)
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"run", "--config", config})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(runCtx) }()
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

	url := "http://" + addr + "/metrics"
	// until scrapes until cond holds of partitions 0 and 1, failing after
	// a minute with what it saw last.
	until := func(what string, cond func(p0, p1 partitionSeries) bool) (partitionSeries, partitionSeries) {
		t.Helper()
		var p0, p1 partitionSeries
		var err error
		deadline := time.Now().Add(60 * time.Second)
		for {
			var fams map[string]*dto.MetricFamily
			if fams, err = scrapeFamilies(url); err == nil {
				p0, p1 = partitionOf(fams, "0"), partitionOf(fams, "1")
				if p0.seen == 4 && p1.seen == 4 && cond(p0, p1) {
					return p0, p1
				}
			}
			select {
			case err := <-done:
				t.Fatalf("run returned early: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("within 60s: %s not seen; last partition 0 %+v, partition 1 %+v (scrape error: %v)", what, p0, p1, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Partition 1 applies; partition 0's records are fetched and wait.
	stalled, _ := until("partition 1 caught up, partition 0 waiting with its records", func(p0, p1 partitionSeries) bool {
		return p1.committed == n && p1.lag == 0 && p1.timeLag == 0 && p0.lag == n && p0.timeLag > 0
	})
	if stalled.committed != 0 || stalled.retrying != 0 || stalled.timeLag < time.Hour.Seconds() {
		t.Errorf("blocked partition 0: %+v; want committed offset 0, not retrying, time lag an hour or more", stalled)
	}
	if got := sinktest.Count(t, pool, `SELECT applied FROM `+schema+`.per_partition WHERE partition = 1`); got != n {
		t.Errorf("partition 1 applied %d records while partition 0 was blocked, want %d", got, n)
	}
	// Scrapes later: the offset stands, the lag stays, the time lag grows.
	later, _ := until("partition 0's time lag grown", func(p0, _ partitionSeries) bool { return p0.timeLag > stalled.timeLag })
	if later.committed != stalled.committed || later.lag != n || later.retrying != 0 {
		t.Errorf("blocked partition 0 moved: %+v, was %+v; want its offset and lag standing, not retrying", later, stalled)
	}
	var waiting int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`,
		schema+".per_partition").Scan(&waiting); err != nil || waiting != 1 {
		t.Errorf("sessions waiting on the row lock: %d, %v; want the one batch of partition 0", waiting, err)
	}

	// Released: partition 0 catches up, every series at rest.
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	until("partition 0 caught up once released", func(p0, _ partitionSeries) bool {
		return p0.committed == n && p0.lag == 0 && p0.timeLag == 0 && p0.retrying == 0
	})
	if got := sinktest.Count(t, pool, `SELECT applied FROM `+schema+`.per_partition WHERE partition = 0`); got != n {
		t.Errorf("partition 0 applied %d records once released, want %d", got, n)
	}
}
