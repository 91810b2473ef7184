package metrics_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/processor"
)

// writer stands where a sink.Writer would; the consumer never runs.
type writer struct{ processor.Writer }

// The handler serves every family, summing batches, consumers and LRU
// lookups.
func TestHandlerServesEveryFamily(t *testing.T) {
	m := metrics.New()
	cache, err := dedup.New(10)
	if err != nil {
		t.Fatal(err)
	}
	key := dedup.Key{EventID: uuid.New(), Handler: "h"}
	cache.Remember([]dedup.Key{key}, nil)
	cache.Seen(key, dedup.Digest{})
	cache.Seen(dedup.Key{EventID: uuid.New(), Handler: "h"}, dedup.Digest{})
	c, err := processor.New(processor.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, Group: "g"}, writer{})
	if err != nil {
		t.Fatal(err)
	}
	m.Add(c, cache)
	m.Add(c, nil)
	m.OnBatch(processor.BatchInfo{Records: 100, Duration: 20 * time.Millisecond})

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"onceflow_records_consumed_total", "onceflow_records_fetched_total", "onceflow_queued_records", "onceflow_queued_value_bytes", "onceflow_events_applied_total",
		"onceflow_duplicates_skipped_total", "onceflow_dead_letters_total", "onceflow_duplicates_conflicting_total", "onceflow_batch_records",
		"onceflow_batch_duration_seconds", "onceflow_transaction_retries_total", "onceflow_batches_fenced_total", "onceflow_dead_letters_published_total",
		"onceflow_batches_total", "onceflow_batches_offset_deferred_total",
		"onceflow_offsets_out_of_range_total", "onceflow_partitions_retrying",
		"onceflow_rebalance_partitions_total", "onceflow_lru_size", "onceflow_lru_lookups_total", "onceflow_lru_hit_ratio",
		"go_goroutines"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if n := fams["onceflow_batch_records"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 1 {
		t.Errorf("onceflow_batch_records has %d samples, want 1", n)
	}
	if v := fams["onceflow_lru_size"].GetMetric()[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("onceflow_lru_size = %v, want 1", v)
	}
	if v := fams["onceflow_lru_hit_ratio"].GetMetric()[0].GetGauge().GetValue(); v != 0.5 {
		t.Errorf("onceflow_lru_hit_ratio = %v, want 0.5 (one hit, one miss)", v)
	}
}
