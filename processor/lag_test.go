package processor_test

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/metrics"
)

// A member with nothing to read reports each assigned partition's lag as
// 0, and exports it (a dashboard cannot tell 0 from absent); a partition
// revoked from it is no longer reported.
func TestLagOfEmptyPartitionsIsZero(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 2)
		m := metrics.New()
		first := e.start(e.config("lag-1"), e.writer(100))
		m.Add(first.c, nil)
		waitWorkersEach(t, 2, first)
		lag := first.c.Lag()
		if len(lag) != 2 {
			t.Fatalf("Lag() = %+v with 2 empty partitions assigned, want both with lag 0", lag)
		}
		for _, l := range lag {
			if l.Topic != e.topic || l.Lag != 0 {
				t.Errorf("Lag() has %+v, want lag 0 of a partition of %s", l, e.topic)
			}
		}
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for p := range 2 {
			if want := fmt.Sprintf(`onceflow_partition_lag{partition="%d",topic="%s"} 0`, p, e.topic); !strings.Contains(rec.Body.String(), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}

		// A second member takes one of the partitions: each reports its own.
		second := e.start(e.config("lag-2"), e.writer(100))
		waitWorkersEach(t, 1, first, second)
		l1, l2 := first.c.Lag(), second.c.Lag()
		if len(l1) != 1 || len(l2) != 1 || l1[0].Partition == l2[0].Partition || l1[0].Lag != 0 || l2[0].Lag != 0 {
			t.Errorf("after the rebalance: Lag() = %+v and %+v, want one partition each, lag 0", l1, l2)
		}
		rec = httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if n := strings.Count(rec.Body.String(), "onceflow_partition_lag{"); n != 1 {
			t.Errorf("/metrics of the first member has %d partition_lag series after the rebalance, want 1 (the revoked one removed)", n)
		}
	})
}

// waitWorkers waits until each member runs n partition workers, failing
// after 60s.
// waitWorkersEach waits until each of ms runs n partition workers.
func waitWorkersEach(t *testing.T, n int64, ms ...*member) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for slices.ContainsFunc(ms, func(m *member) bool { return m.c.Stats().Workers != n }) {
		if time.Now().After(deadline) {
			var got []int64
			for _, m := range ms {
				got = append(got, m.c.Stats().Workers)
			}
			t.Fatalf("workers %v within 60s, want %d each", got, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
