package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/processor"
)

var (
	descTimeLag   = prometheus.NewDesc("onceflow_partition_time_lag_seconds", "Seconds between now and the timestamp of the partition's oldest record fetched but not yet applied; 0 when caught up. Every partition with a worker exports it.", []string{"topic", "partition"}, nil)
	descCommitted = prometheus.NewDesc("onceflow_partition_committed_offset", "Offset of the next record the partition's worker applies: every record below it is committed to Postgres. It stands still while the partition is stalled.", []string{"topic", "partition"}, nil)
	descPRetrying = prometheus.NewDesc("onceflow_partition_retrying", "1 from a batch's first failure until its records commit (retries and the smaller batches after a timeout included), else 0.", []string{"topic", "partition"}, nil)
	descReady     = prometheus.NewDesc("onceflow_ready", "1 when the member's readiness check (the one /readyz names) holds, else 0.", []string{"check"}, nil)
)

// partitions is the per-partition half of Metrics: the state of every
// partition each consumer has a worker for (processor.Consumer.Partitions),
// and the member's readiness checks.
type partitions struct {
	m   *Metrics
	now func() time.Time

	mu     sync.Mutex
	checks []check
}

type check struct {
	name  string
	ready func(context.Context) error
}

// checkTimeout bounds one readiness check during a scrape, as /readyz does.
const checkTimeout = 2 * time.Second

// AddCheck exports ready as onceflow_ready{check=name}: 1 when it returns
// nil, else 0. Each scrape calls it once, with a 2s deadline; ready must
// be safe for concurrent use. Use the checks /readyz uses, so an alert on
// onceflow_ready says what /readyz would.
func (m *Metrics) AddCheck(name string, ready func(context.Context) error) {
	m.parts.mu.Lock()
	m.parts.checks = append(m.parts.checks, check{name, ready})
	m.parts.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (p *partitions) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTimeLag, descCommitted, descPRetrying, descReady} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (p *partitions) Collect(ch chan<- prometheus.Metric) {
	p.m.mu.Lock()
	cs := append([]*processor.Consumer(nil), p.m.consumers...)
	p.m.mu.Unlock()
	p.mu.Lock()
	checks := append([]check(nil), p.checks...)
	p.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	now := p.now()
	seen := map[[2]string]bool{}
	for _, c := range cs {
		for _, s := range c.Partitions() {
			k := [2]string{s.Topic, strconv.Itoa(int(s.Partition))}
			if seen[k] {
				continue // two consumers of this process in one group: one owns it, the other is being revoked
			}
			seen[k] = true
			gauge(descTimeLag, s.TimeLag(now).Seconds(), k[0], k[1])
			gauge(descCommitted, float64(s.CommittedOffset), k[0], k[1])
			retrying := 0.0
			if s.Retrying {
				retrying = 1
			}
			gauge(descPRetrying, retrying, k[0], k[1])
		}
	}
	for _, c := range checks {
		ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
		ok := 0.0
		if c.ready(ctx) == nil {
			ok = 1
		}
		cancel()
		gauge(descReady, ok, c.name)
	}
}
