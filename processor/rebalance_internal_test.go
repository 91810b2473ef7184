package processor

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// An out-of-range stored offset is reported (logged and counted) once
// per finding by a member: a partition taken again with the same stored
// offset and ids (under the consumer protocol, assigned before and after
// a recreated topic is re-added) is not reported again; another finding
// for it, or the same one for another partition, is.
func TestOutOfRangeReportedOncePerFinding(t *testing.T) {
	c := &Consumer{}
	p0, p1 := tp{"orders", 0}, tp{"orders", 1}
	for i, step := range []struct {
		k       tp
		finding string
		want    bool
	}{
		{p0, "50 a b", true},
		{p0, "50 a b", false},
		{p1, "50 a b", true},
		{p0, "60 a b", true},
		{p0, "50 a b", true},
	} {
		if got := c.firstFinding(step.k, step.finding); got != step.want {
			t.Errorf("step %d: firstFinding(%v, %q) = %v, want %v", i, step.k, step.finding, got, step.want)
		}
	}
}

// The assignment's log line names each partition once, in order, as
// franz-go may list some twice (a topic re-added with more partitions).
func TestAssignedLogsEachPartitionOnce(t *testing.T) {
	var buf bytes.Buffer
	c := &Consumer{log: slog.New(slog.NewTextHandler(&buf, nil))}
	c.assigned(t.Context(), nil, map[string][]int32{"orders": {0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5}, "none": {}})
	if got := buf.String(); strings.Count(got, "partitions assigned") != 1 || !strings.Contains(got, `partitions="[0 1 2 3 4 5]"`) {
		t.Errorf("logged %q, want one line with partitions [0 1 2 3 4 5]", got)
	}
}
