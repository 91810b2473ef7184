package main

import (
	"bufio"
	"io"
	"slices"
	"strconv"
	"strings"
)

// BacklogSample is the state of a backlog run at one moment, read from
// outside the member: Postgres, the member's /metrics and /proc.
type BacklogSample struct {
	T         float64 `json:"t"`         // seconds since the member started
	Committed int64   `json:"committed"` // records committed: sum of sink_offsets.next_offset
	Applied   int64   `json:"applied"`   // (event, handler) pairs applied: onceflow_events_applied_total
	Consumed  int64   `json:"consumed"`  // records received: onceflow_records_consumed_total
	// DedupRows is processed_events' rows: the pre-filled ones plus those
	// the member applied.
	DedupRows     int64   `json:"dedup_rows"`
	TableBytes    int64   `json:"table_bytes"`    // pg_relation_size(processed_events)
	IndexBytes    int64   `json:"index_bytes"`    // pg_indexes_size(processed_events)
	BusinessBytes int64   `json:"business_bytes"` // pg_total_relation_size of emails_sent
	RSSMiB        float64 `json:"rss_mib"`        // the member's VmRSS
	// PartitionsDone counts the partitions whose every record is
	// committed: from the first one on, the member works on fewer
	// partitions than it was given, and its rate is the tail's.
	PartitionsDone int `json:"partitions_done"`
}

// SizeRate is the member's rate while processed_events grew from
// RowsFrom to RowsTo rows.
type SizeRate struct {
	RowsFrom      int64   `json:"rows_from"`
	RowsTo        int64   `json:"rows_to"`
	Seconds       float64 `json:"seconds"`
	EventsPerSec  float64 `json:"events_per_sec"`  // unique events applied per second
	RecordsPerSec float64 `json:"records_per_sec"` // records committed per second, redeliveries included
	TableMiB      float64 `json:"table_mib"`       // processed_events heap at the span's end
	IndexMiB      float64 `json:"index_mib"`       // and its indexes
	MaxRSSMiB     float64 `json:"max_rss_mib"`     // the member's largest sampled RSS in the span
}

// bySize splits a run's samples into spans of equal dedup-table growth and
// gives each span's rates. The first span starts at the first sample with
// anything applied (the member's start-up, joining the group and the
// first fetch are left out); the last ends at the last sample before a
// partition was done (the tail, with fewer partitions to work on, is left
// out too). A span ends at the first sample at or past its boundary, so
// spans share their edge samples and together cover the run between.
// handlers is the number of handlers, so that applied pairs become
// events. Spans with no time between their edges are dropped.
func bySize(samples []BacklogSample, handlers, spans int) []SizeRate {
	end := len(samples)
	for end > 0 && samples[end-1].PartitionsDone > 0 {
		end--
	}
	samples = samples[:end]
	start := slices.IndexFunc(samples, func(s BacklogSample) bool { return s.Applied > 0 })
	if start < 0 || len(samples)-start < 2 || spans < 1 {
		return nil
	}
	handlers = max(handlers, 1)
	first, last := samples[start], samples[len(samples)-1]
	grown := last.DedupRows - first.DedupRows
	if grown <= 0 {
		return nil
	}
	var out []SizeRate
	a := start
	for k := 1; k <= spans && a < len(samples)-1; k++ {
		bound := first.DedupRows + grown*int64(k)/int64(spans)
		b := a + 1
		for b < len(samples)-1 && samples[b].DedupRows < bound {
			b++
		}
		from, to := samples[a], samples[b]
		if dt := to.T - from.T; dt > 0 {
			r := SizeRate{RowsFrom: from.DedupRows, RowsTo: to.DedupRows, Seconds: dt,
				EventsPerSec:  float64(to.Applied-from.Applied) / float64(handlers) / dt,
				RecordsPerSec: float64(to.Committed-from.Committed) / dt,
				TableMiB:      float64(to.TableBytes) / (1 << 20), IndexMiB: float64(to.IndexBytes) / (1 << 20)}
			for _, s := range samples[a : b+1] {
				r.MaxRSSMiB = max(r.MaxRSSMiB, s.RSSMiB)
			}
			out = append(out, r)
		}
		a = b
	}
	return out
}

// holdRatio is the last span's event rate over the first's: how much of
// its rate on the smaller table the member keeps on the larger one.
func holdRatio(spans []SizeRate) float64 {
	if len(spans) < 2 || spans[0].EventsPerSec == 0 {
		return 0
	}
	return spans[len(spans)-1].EventsPerSec / spans[0].EventsPerSec
}

// promCounters reads the named counters, without labels, from a Prometheus
// text exposition; names absent from it are absent from the map.
func promCounters(r io.Reader, names ...string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || !want[f[0]] {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, err
		}
		out[f[0]] = v
	}
	return out, sc.Err()
}

// procStatusKiB reads one "Vm…: N kB" field of a /proc/<pid>/status text.
func procStatusKiB(status, field string) (int64, bool) {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0, false
			}
			n, err := strconv.ParseInt(f[0], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// partitionsDone counts the partitions with records (ends: the offset
// after each one's last record) whose next offset has reached the end.
func partitionsDone(next, ends map[int32]int64) int {
	n := 0
	for p, end := range ends {
		if end > 0 && next[p] >= end {
			n++
		}
	}
	return n
}

// medianRate is the median of the spans' event rates.
func medianRate(spans []SizeRate) float64 {
	if len(spans) == 0 {
		return 0
	}
	r := make([]float64, len(spans))
	for i, s := range spans {
		r[i] = s.EventsPerSec
	}
	slices.Sort(r)
	if len(r)%2 == 1 {
		return r[len(r)/2]
	}
	return (r[len(r)/2-1] + r[len(r)/2]) / 2
}
