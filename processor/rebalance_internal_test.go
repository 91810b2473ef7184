package processor

import "testing"

// An out-of-range stored offset is reported (logged and counted) once
// per finding: a partition taken again with the same stored offset, ids
// and log bounds (under the consumer protocol, assigned before and after
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
		{p0, "50 a b 200 300", true},
		{p0, "50 a b 200 300", false},
		{p1, "50 a b 200 300", true},
		{p0, "50 a b 250 300", true},
		{p0, "50 a b 200 300", true},
	} {
		if got := c.firstFinding(step.k, step.finding); got != step.want {
			t.Errorf("step %d: firstFinding(%v, %q) = %v, want %v", i, step.k, step.finding, got, step.want)
		}
	}
}
