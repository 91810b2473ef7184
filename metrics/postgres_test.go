package metrics_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/metrics"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func scrape(t *testing.T, m *metrics.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value is the value of the one series of name whose labels include
// labels, or fails.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
next:
	for _, m := range fams[name].GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("/metrics has no %s%v", name, labels)
	return 0
}

// A pool's size, connections in use and acquires that waited are
// exported: with its one connection taken, the next acquire waits until
// its context ends, and is counted as given up.
func TestPoolSaturationIsExported(t *testing.T) {
	pool := sinktest.SizedPool(t, 1)
	m := metrics.New()
	m.AddPool("main", pool)

	held, err := pool.Acquire(t.Context()) // the pool is empty: this acquire waits for a new connection
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err = pool.Acquire(ctx)
	cancel()
	if err == nil {
		t.Fatal("a second connection was acquired from a pool of one")
	}
	fams := scrape(t, m)
	for _, tc := range []struct {
		name     string
		min, max float64
	}{
		{"onceflow_postgres_pool_max_connections", 1, 1},
		{"onceflow_postgres_pool_acquired_connections", 1, 1},
		{"onceflow_postgres_pool_idle_connections", 0, 0},
		{"onceflow_postgres_pool_connections", 1, 1},
		{"onceflow_postgres_pool_acquires_total", 1, 1},
		{"onceflow_postgres_pool_empty_acquires_total", 1, 1},
		{"onceflow_postgres_pool_empty_acquire_wait_seconds_total", 0, 60},
		{"onceflow_postgres_pool_canceled_acquires_total", 1, 1},
	} {
		if got := value(t, fams, tc.name, "pool", "main"); got < tc.min || got > tc.max {
			t.Errorf("%s = %v with the one connection held, want %v..%v", tc.name, got, tc.min, tc.max)
		}
	}
	held.Release()
	fams = scrape(t, m)
	if got := value(t, fams, "onceflow_postgres_pool_acquired_connections", "pool", "main"); got != 0 {
		t.Errorf("acquired connections = %v once released, want 0", got)
	}
	if got := value(t, fams, "onceflow_postgres_pool_idle_connections", "pool", "main"); got != 1 {
		t.Errorf("idle connections = %v once released, want 1", got)
	}
}

// The backlogs' ages are exported as their functions say, and omitted
// from a scrape where the function fails (Postgres away) rather than
// failing the scrape.
func TestBacklogAgesAreExported(t *testing.T) {
	m := metrics.New()
	if fams := scrape(t, m); fams["onceflow_outbox_oldest_pending_age_seconds"] != nil || fams["onceflow_dead_letters_oldest_unpublished_age_seconds"] != nil {
		t.Fatal("backlog ages exported before any was added")
	}
	m.AddOutbox(func(ctx context.Context) (time.Duration, error) {
		if _, ok := ctx.Deadline(); !ok {
			return 0, errors.New("no deadline")
		}
		return 90 * time.Second, nil
	})
	m.AddDeadLetterTopic(func(context.Context) (time.Duration, error) { return 0, errors.New("postgres is away") })
	fams := scrape(t, m)
	if got := value(t, fams, "onceflow_outbox_oldest_pending_age_seconds"); got != 90 {
		t.Errorf("outbox age = %v, want 90", got)
	}
	if fams["onceflow_dead_letters_oldest_unpublished_age_seconds"] != nil {
		t.Error("a dead-letter age whose query failed was exported")
	}
}

// A retention step's status is exported per schema: how late the rotation
// and the drop are (0 when not due), the slices, held, busy and failing.
func TestRetentionStateIsExported(t *testing.T) {
	m := metrics.New()
	now := time.Now()
	m.OnRetentionStep(dedup.RetentionStatus{Schema: "a", Slices: 3, RotationDue: now.Add(-10 * time.Minute), DropDue: now.Add(-2 * time.Hour),
		Held: "a replay has not caught up", Busy: 4, Err: errors.New("permission denied")})
	m.OnRetentionStep(dedup.RetentionStatus{Schema: "b", Slices: 1, RotationDue: now.Add(time.Hour)})
	fams := scrape(t, m)
	for _, tc := range []struct {
		name, schema string
		min, max     float64
	}{
		{"onceflow_dedup_slices", "a", 3, 3},
		{"onceflow_dedup_rotation_overdue_seconds", "a", 600, 660},
		{"onceflow_dedup_drop_overdue_seconds", "a", 7200, 7260},
		{"onceflow_dedup_drop_held", "a", 1, 1},
		{"onceflow_dedup_retention_busy_steps", "a", 4, 4},
		{"onceflow_dedup_retention_failing", "a", 1, 1},
		{"onceflow_dedup_slices", "b", 1, 1},
		{"onceflow_dedup_rotation_overdue_seconds", "b", 0, 0},
		{"onceflow_dedup_drop_overdue_seconds", "b", 0, 0},
		{"onceflow_dedup_drop_held", "b", 0, 0},
		{"onceflow_dedup_retention_busy_steps", "b", 0, 0},
		{"onceflow_dedup_retention_failing", "b", 0, 0},
	} {
		if got := value(t, fams, tc.name, "schema", tc.schema); got < tc.min || got > tc.max {
			t.Errorf("%s{schema=%q} = %v, want %v..%v", tc.name, tc.schema, got, tc.min, tc.max)
		}
	}
}
