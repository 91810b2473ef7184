package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/processor"
)

// Metrics exposes the counters of every consumer of this process (the demo
// runs several) and of their dedup caches, plus batch histograms fed by
// processor.Config.OnBatch, to Prometheus. It is safe for concurrent use.
type Metrics struct {
	reg       *prometheus.Registry
	batchSize prometheus.Histogram
	batchDur  prometheus.Histogram

	mu        sync.Mutex
	consumers []*processor.Consumer
	caches    []*dedup.Cache

	parts partitions // per-partition state and readiness: partitions.go
	pg    postgres   // pools, publication backlogs, dedup retention: postgres.go
}

// New returns Metrics with their own registry, which also holds the Go
// runtime's and the process's collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.parts = partitions{m: m, now: time.Now}
	m.pg = postgres{now: time.Now}
	m.batchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "onceflow_batch_records", Help: "Records per committed batch.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 8),
	})
	m.batchDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "onceflow_batch_duration_seconds", Help: "Time from a batch closing to its COMMIT, retries included.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	})
	m.reg.MustRegister(m.batchSize, m.batchDur, m, &m.parts, &m.pg, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Add makes c and its writer's cache (nil if none) part of the metrics,
// for as long as m lives.
func (m *Metrics) Add(c *processor.Consumer, cache *dedup.Cache) {
	m.mu.Lock()
	m.consumers = append(m.consumers, c)
	m.caches = append(m.caches, cache)
	m.mu.Unlock()
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// OnBatch records a committed batch; it is a processor.Config.OnBatch.
func (m *Metrics) OnBatch(b processor.BatchInfo) {
	if b.Result.OffsetDeferred {
		return // no transaction: onceflow_batches_offset_deferred_total counts it
	}
	m.batchSize.Observe(float64(b.Records))
	m.batchDur.Observe(b.Duration.Seconds())
}

var (
	descRecords   = prometheus.NewDesc("onceflow_records_consumed_total", "Records received from Kafka, duplicates included.", nil, nil)
	descFetched   = prometheus.NewDesc("onceflow_records_fetched_total", "Records decoded from fetch responses, including ones never delivered: a paused partition's in-flight fetch (fetched again), fetches discarded by a rebalance or seek, aborted transactions' records and markers, records before the fetch offset.", nil, nil)
	descQueued    = prometheus.NewDesc("onceflow_queued_records", "Records fetched and waiting in the partitions' queues for their worker.", nil, nil)
	descQueuedB   = prometheus.NewDesc("onceflow_queued_value_bytes", "Value bytes of the records waiting in the partitions' queues.", nil, nil)
	descApplied   = prometheus.NewDesc("onceflow_events_applied_total", "(event, handler) pairs applied.", nil, nil)
	descSkipped   = prometheus.NewDesc("onceflow_duplicates_skipped_total", "(event, handler) pairs skipped as duplicates, by layer.", []string{"layer"}, nil)
	descDead      = prometheus.NewDesc("onceflow_dead_letters_total", "Rows inserted into dead_letters: a record read again whose dead letter is recorded already is not counted again.", nil, nil)
	descConflicts = prometheus.NewDesc("onceflow_duplicates_conflicting_total", "Events whose event_id was already applied with a different payload: dead-lettered, the first version's effects stand.", nil, nil)
	descBatches   = prometheus.NewDesc("onceflow_batches_total", "Batches committed, or found whole with their offset deferred.", nil, nil)
	descDeferred  = prometheus.NewDesc("onceflow_batches_offset_deferred_total", "Batches found whole (every event applied before: a replay's re-read) that wrote nothing and left their offset to a later batch.", nil, nil)
	descRetries   = prometheus.NewDesc("onceflow_transaction_retries_total", "Batch transactions retried after an error.", nil, nil)
	descFenced    = prometheus.NewDesc("onceflow_batches_fenced_total", "Batches rolled back by the sink_offsets fence (the worker then stopped).", nil, nil)
	descPublished = prometheus.NewDesc("onceflow_dead_letters_published_total", "Dead letters copied from the dead_letters table to the dead-letter topic.", nil, nil)
	descRange     = prometheus.NewDesc("onceflow_offsets_out_of_range_total", "Offsets stored in Postgres found outside their partition's log.", nil, nil)
	descRetrying  = prometheus.NewDesc("onceflow_partitions_retrying", "Partitions retrying a batch: from its first failure until its records commit (retries and the smaller batches after a timeout included).", nil, nil)
	descRebalance = prometheus.NewDesc("onceflow_rebalance_partitions_total", "Partitions assigned, revoked or lost.", []string{"kind"}, nil)
	descWorkers   = prometheus.NewDesc("onceflow_partition_workers", "Partition workers running.", nil, nil)
	descLag       = prometheus.NewDesc("onceflow_partition_lag", "Records between the end of what a partition can be read to (its last stable offset: records are read committed) and its next offset; transaction markers and aborted records count as read once passed.", []string{"topic", "partition"}, nil)
	descLRUSize   = prometheus.NewDesc("onceflow_lru_size", "Events in the dedup LRU (one entry holds all of an event's handlers).", nil, nil)
	descLRUHits   = prometheus.NewDesc("onceflow_lru_lookups_total", "Dedup LRU lookups, by result.", []string{"result"}, nil)
	descLRURatio  = prometheus.NewDesc("onceflow_lru_hit_ratio", "Dedup LRU hits / lookups since start.", nil, nil)
)

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRecords, descFetched, descQueued, descQueuedB, descApplied, descSkipped, descDead, descConflicts, descBatches, descDeferred, descRetries,
		descFenced, descPublished, descRange, descRetrying, descRebalance, descWorkers, descLag, descLRUSize, descLRUHits, descLRURatio} {
		ch <- d
	}
}

// Collect implements prometheus.Collector, summing over the consumers.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	cs := append([]*processor.Consumer(nil), m.consumers...)
	caches := append([]*dedup.Cache(nil), m.caches...)
	m.mu.Unlock()
	var t processor.Stats
	lag := map[[2]string]int64{}
	for _, c := range cs {
		t = t.Plus(c.Stats())
		for _, l := range c.Lag() {
			lag[[2]string{l.Topic, strconv.Itoa(int(l.Partition))}] = l.Lag
		}
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(descRecords, t.RecordsConsumed)
	counter(descFetched, t.RecordsFetched)
	gauge(descQueued, float64(t.QueuedRecords))
	gauge(descQueuedB, float64(t.QueuedBytes))
	counter(descApplied, t.Applied)
	counter(descSkipped, t.SkippedLRU, "lru")
	counter(descSkipped, t.SkippedPostgres, "postgres")
	counter(descDead, t.DeadLetters)
	counter(descConflicts, t.Conflicts)
	counter(descBatches, t.Batches)
	counter(descDeferred, t.OffsetsDeferred)
	counter(descRetries, t.Retries)
	counter(descFenced, t.Fenced)
	counter(descPublished, t.DeadLettersPublished)
	counter(descRange, t.OffsetsOutOfRange)
	gauge(descRetrying, float64(t.Retrying))
	counter(descRebalance, t.Assigned, "assigned")
	counter(descRebalance, t.Revoked, "revoked")
	counter(descRebalance, t.Lost, "lost")
	gauge(descWorkers, float64(t.Workers))
	for k, v := range lag {
		gauge(descLag, float64(v), k[0], k[1])
	}
	var lru dedup.Stats
	for _, c := range caches {
		if c == nil {
			continue
		}
		st := c.Stats()
		lru.Len += st.Len
		lru.Hits += st.Hits
		lru.Misses += st.Misses
	}
	gauge(descLRUSize, float64(lru.Len))
	counter(descLRUHits, lru.Hits, "hit")
	counter(descLRUHits, lru.Misses, "miss")
	ratio := 0.0
	if n := lru.Hits + lru.Misses; n > 0 {
		ratio = float64(lru.Hits) / float64(n)
	}
	gauge(descLRURatio, ratio)
}
