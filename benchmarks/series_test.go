package main

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/orders"
)

// samples builds a run: prefill rows, then per second the (event, handler)
// pairs applied in that second, and the records committed (pairs ×
// recsPerPair).
func samples(prefill int64, perSecond []int64, handlers int) []BacklogSample {
	s := []BacklogSample{{T: 0, DedupRows: prefill}}
	var applied int64
	for i, n := range perSecond {
		applied += n
		s = append(s, BacklogSample{T: float64(i + 1), Applied: applied, Committed: applied / int64(handlers) * 2,
			DedupRows: prefill + applied, TableBytes: (prefill + applied) * 100, IndexBytes: (prefill + applied) * 50,
			RSSMiB: float64(100 + i)})
	}
	return s
}

func TestBySize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		samples  []BacklogSample
		handlers int
		spans    int
		want     []SizeRate // only rows, seconds and rates are compared
	}{
		{
			name: "two spans, start-up left out, rate falls as the table grows",
			// 2 s of start-up, then 1000/s for 5 s (the first second is
			// start-up too), then 500/s for 8 s.
			samples: samples(10000, []int64{0, 0, 1000, 1000, 1000, 1000, 1000, 500, 500, 500, 500, 500, 500, 500, 500}, 1),
			spans:   2, handlers: 1,
			want: []SizeRate{
				{RowsFrom: 11000, RowsTo: 15000, Seconds: 4, EventsPerSec: 1000, RecordsPerSec: 2000},
				{RowsFrom: 15000, RowsTo: 19000, Seconds: 8, EventsPerSec: 500, RecordsPerSec: 1000},
			},
		},
		{
			name:    "pairs become events by the handler count",
			samples: samples(0, []int64{400, 400, 400}, 4),
			spans:   1, handlers: 4,
			want: []SizeRate{{RowsFrom: 400, RowsTo: 1200, Seconds: 2, EventsPerSec: 100, RecordsPerSec: 200}},
		},
		{
			name: "a boundary between samples ends the span at the next sample",
			// from 100 rows, growth 300: boundaries at 200, 300, 400; samples
			// at 250 and 400: spans [100,250], [250,400], the third empty.
			samples: samples(0, []int64{100, 150, 150}, 1),
			spans:   3, handlers: 1,
			want: []SizeRate{
				{RowsFrom: 100, RowsTo: 250, Seconds: 1, EventsPerSec: 150, RecordsPerSec: 300},
				{RowsFrom: 250, RowsTo: 400, Seconds: 1, EventsPerSec: 150, RecordsPerSec: 300},
			},
		},
		{name: "one sample", samples: samples(5, nil, 1), spans: 4, handlers: 1},
		{name: "nothing applied", samples: samples(5, []int64{0, 0}, 1), spans: 4, handlers: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := bySize(tc.samples, tc.handlers, tc.spans)
			if len(got) != len(tc.want) {
				t.Fatalf("bySize() = %d spans %+v, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.RowsFrom != w.RowsFrom || g.RowsTo != w.RowsTo || g.Seconds != w.Seconds ||
					math.Abs(g.EventsPerSec-w.EventsPerSec) > 1e-9 || math.Abs(g.RecordsPerSec-w.RecordsPerSec) > 1e-9 {
					t.Errorf("span %d = %+v, want rows %d-%d, %v s, %v events/s, %v records/s", i, g,
						w.RowsFrom, w.RowsTo, w.Seconds, w.EventsPerSec, w.RecordsPerSec)
				}
			}
		})
	}
}

func TestBySizeSpanSizesAndRSS(t *testing.T) {
	got := bySize(samples(0, []int64{100, 100, 100, 100}, 1), 1, 2)
	if len(got) != 2 {
		t.Fatalf("bySize() = %+v, want 2 spans", got)
	}
	// From 100 rows, growth 300: the first span ends at 300 rows (sample
	// 3), the second covers samples 3..4 (RSS 102, 103) and ends at 400.
	if got[1].MaxRSSMiB != 103 {
		t.Errorf("second span max RSS = %v, want 103", got[1].MaxRSSMiB)
	}
	if want := float64(400*100) / (1 << 20); got[1].TableMiB != want {
		t.Errorf("second span table MiB = %v, want %v (the size at its end)", got[1].TableMiB, want)
	}
}

func TestHoldRatio(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spans []SizeRate
		want  float64
	}{
		{"halved", []SizeRate{{EventsPerSec: 1000}, {EventsPerSec: 800}, {EventsPerSec: 500}}, 0.5},
		{"one span", []SizeRate{{EventsPerSec: 1000}}, 0},
		{"first span idle", []SizeRate{{EventsPerSec: 0}, {EventsPerSec: 10}}, 0},
	} {
		if got := holdRatio(tc.spans); got != tc.want {
			t.Errorf("%s: holdRatio = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPromCounters(t *testing.T) {
	text := `# HELP onceflow_events_applied_total (event, handler) pairs applied.
# TYPE onceflow_events_applied_total counter
onceflow_events_applied_total 1.234567e+06
onceflow_records_consumed_total 42
onceflow_duplicates_skipped_total{layer="lru"} 7
onceflow_events_applied_total_other 9
`
	got, err := promCounters(strings.NewReader(text), "onceflow_events_applied_total", "onceflow_records_consumed_total", "onceflow_missing")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"onceflow_events_applied_total": 1234567, "onceflow_records_consumed_total": 42}
	if len(got) != len(want) || got["onceflow_events_applied_total"] != want["onceflow_events_applied_total"] ||
		got["onceflow_records_consumed_total"] != want["onceflow_records_consumed_total"] {
		t.Errorf("promCounters = %v, want %v", got, want)
	}
	if _, err := promCounters(strings.NewReader("onceflow_records_consumed_total x\n"), "onceflow_records_consumed_total"); err == nil {
		t.Error("promCounters accepted a value that is not a number")
	}
}

func TestProcStatusKiB(t *testing.T) {
	status := "Name:\tonceflow\nVmHWM:\t  283456 kB\nVmRSS:\t  201000 kB\n"
	for _, tc := range []struct {
		field string
		want  int64
		ok    bool
	}{{"VmHWM", 283456, true}, {"VmRSS", 201000, true}, {"VmSwap", 0, false}} {
		if got, ok := procStatusKiB(status, tc.field); got != tc.want || ok != tc.ok {
			t.Errorf("procStatusKiB(%s) = %d, %v, want %d, %v", tc.field, got, ok, tc.want, tc.ok)
		}
	}
}

func TestRedactDSN(t *testing.T) {
	got := redactDSN([]string{"backlog", "-dsn", "postgres://u:secret@h/db", "-records", "5", "--dsn=postgres://u:secret@h/db"})
	want := []string{"backlog", "-dsn", "$DSN", "-records", "5", "--dsn=$DSN"}
	if !slices.Equal(got, want) {
		t.Errorf("redactDSN = %q, want %q", got, want)
	}
}

func TestTimeOrdered(t *testing.T) {
	s, err := orders.Generate(200, 0.5, 3)
	if err != nil {
		t.Fatal(err)
	}
	got, err := timeOrdered(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Messages) != len(s.Messages) || len(got.Unique) != len(s.Unique) {
		t.Fatalf("timeOrdered: %d messages, %d events, want %d, %d", len(got.Messages), len(got.Unique), len(s.Messages), len(s.Unique))
	}
	old := map[uuid.UUID]uuid.UUID{} // new id -> old id
	var last uuid.UUID
	for i, m := range got.Messages {
		was := s.Messages[i].ID
		if prev, seen := old[m.ID]; seen {
			if prev != was {
				t.Fatalf("message %d: id %s stands for %s and %s", i, m.ID, prev, was)
			}
			continue
		}
		old[m.ID] = was
		if m.ID.Version() != 7 {
			t.Errorf("message %d: id %s is version %d, want 7", i, m.ID, m.ID.Version())
		}
		if strings.Compare(m.ID.String(), last.String()) <= 0 {
			t.Errorf("message %d: new id %s does not sort after %s", i, m.ID, last)
		}
		last = m.ID
		if !slices.Equal(m.Value, s.Messages[i].Value) || got.Unique[m.ID].UserID != s.Unique[was].UserID {
			t.Errorf("message %d: payload changed", i)
		}
	}
}

func TestBySizeLeavesOutTheTail(t *testing.T) {
	// 1000/s for 4 s, then a partition is done and the rest trickle in.
	s := samples(0, []int64{1000, 1000, 1000, 1000, 100, 100}, 1)
	s[5].PartitionsDone, s[6].PartitionsDone = 1, 3
	got := bySize(s, 1, 2)
	want := []SizeRate{{RowsFrom: 1000, RowsTo: 3000, Seconds: 2, EventsPerSec: 1000}, {RowsFrom: 3000, RowsTo: 4000, Seconds: 1, EventsPerSec: 1000}}
	if len(got) != len(want) {
		t.Fatalf("bySize() = %+v, want %d spans ending at 4000 rows", got, len(want))
	}
	for i, w := range want {
		if got[i].RowsFrom != w.RowsFrom || got[i].RowsTo != w.RowsTo || got[i].EventsPerSec != w.EventsPerSec {
			t.Errorf("span %d = %+v, want rows %d-%d at %v events/s", i, got[i], w.RowsFrom, w.RowsTo, w.EventsPerSec)
		}
	}
	if h := holdRatio(got); h != 1 {
		t.Errorf("holdRatio = %v, want 1 (the tail is not the table's doing)", h)
	}
}

func TestPartitionsDone(t *testing.T) {
	ends := map[int32]int64{0: 10, 1: 5, 2: 0} // partition 2 got no records
	for _, tc := range []struct {
		name string
		next map[int32]int64
		want int
	}{
		{"none stored yet", map[int32]int64{}, 0},
		{"one reached its end", map[int32]int64{0: 9, 1: 5}, 1},
		{"all with records done", map[int32]int64{0: 10, 1: 5}, 2},
	} {
		if got := partitionsDone(tc.next, ends); got != tc.want {
			t.Errorf("%s: partitionsDone = %d, want %d", tc.name, got, tc.want)
		}
	}
}
