package metrics_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/onceflow/onceflow/metrics"
)

// Each readiness check is exported as onceflow_ready{check}: 1 when it
// holds, 0 when it does not, asked at each scrape.
func TestChecksAreExportedAsReady(t *testing.T) {
	m := metrics.New()
	kafkaErr := errors.New("kafka: not connected yet")
	m.AddCheck("postgres", func(context.Context) error { return nil })
	m.AddCheck("kafka", func(context.Context) error { return kafkaErr })
	scrape := func() map[string]float64 {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, s := range fams["onceflow_ready"].GetMetric() {
			got[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
		}
		return got
	}
	got := scrape()
	if got["postgres"] != 1 || got["kafka"] != 0 || len(got) != 2 {
		t.Errorf("onceflow_ready = %v, want postgres 1, kafka 0", got)
	}
	kafkaErr = nil
	if got := scrape(); got["kafka"] != 1 {
		t.Errorf("onceflow_ready = %v after kafka answered, want kafka 1", got)
	}
}
