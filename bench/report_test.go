package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// Validate lists every problem at once, each naming its field, the
// names of the CPU profile's run and of the scenarios included.
func TestValidateListsEveryProblem(t *testing.T) {
	err := Config{Topic: "t", Events: -1, Duplicates: 5, StormEvery: -time.Second, Schema: "BAD", CPUProfileOf: "zz",
		Scenarios: []string{""}, PoolSize: -1}.Validate()
	fields := map[string]bool{}
	for _, p := range Problems(err) {
		var ce *ConfigError
		if errors.As(p, &ce) {
			fields[ce.Field] = true
		}
	}
	for _, w := range []string{"Events -1", "Duplicates 5: a share from 0 to 1", "StormEvery -1s", `Schema "BAD"`,
		`CPUProfileOf "zz"`, `unknown scenario ""`, "PoolSize -1"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: %v\nwant it to say %q", err, w)
		}
	}
	for _, f := range []string{"Events", "Duplicates", "StormEvery", "Schema", "CPUProfileOf", "Scenarios", "PoolSize"} {
		if !fields[f] {
			t.Errorf("no ConfigError for field %s in %v", f, err)
		}
	}
}

// Values that would crash or hang a run are refused by Validate and by
// Generate: NaN and infinite shares, a stream too big to hold, more
// partitions than MaxPartitions, a schema prefix Postgres keeps.
func TestValidateRefusesWhatWouldCrash(t *testing.T) {
	for _, tt := range []struct {
		name string
		c    Config
		want string
	}{
		{"NaN duplicates", Config{Duplicates: math.NaN()}, "Duplicates NaN: a share from 0 to 1"},
		{"+Inf duplicates", Config{Duplicates: math.Inf(1)}, "Duplicates +Inf: a share from 0 to 1"},
		{"-Inf duplicates", Config{Duplicates: math.Inf(-1)}, "Duplicates -Inf: a share from 0 to 1"},
		{"a trillion events", Config{Events: 1_000_000_000_000, Duplicates: 0.3}, "Events 1000000000000: with Duplicates 0.3, 1300000000000 records: at most 10000000 records"},
		{"duplicates push it over", Config{Events: 8_000_000, Duplicates: 0.3}, "Events 8000000: with Duplicates 0.3, 10400000 records"},
		{"partitions", Config{Partitions: MaxPartitions + 1}, "Partitions 1001: at most 1000"},
		{"pg_ schema", Config{Schema: "pg_x"}, `Schema "pg_x": lower-case letters, digits and _ only, starting with a letter, at most 30, not pg_`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ps := flagsProblems(tt.c)
			if len(ps) != 1 || !strings.Contains(ps[0].Error(), tt.want) {
				t.Fatalf("Validate: %v\nwant one problem saying %q", ps, tt.want)
			}
		})
	}
	for _, ok := range []Config{{Events: 7_000_000, Duplicates: 0.3}, {Partitions: MaxPartitions}, {Schema: "pgx_bench"}} {
		if ps := flagsProblems(ok); len(ps) > 0 {
			t.Errorf("Validate: %v, want none", ps)
		}
	}
	p, err := ParseSample([]byte(`{"a": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []GenerateConfig{{Events: 10, Duplicates: math.NaN(), Partitions: 1}, {Events: 1_000_000_000_000, Partitions: 1}} {
		if _, err := Generate(p, c); err == nil {
			t.Errorf("Generate(%+v) made a stream; want an error", c)
		}
	}
}

// flagsProblems are c.Validate's problems but those of the fields only a
// configuration gives (Pool, Handlers, Payloads, Topic).
func flagsProblems(c Config) []error {
	ps := Problems(c.Validate())
	return slices.DeleteFunc(ps, func(p error) bool {
		var ce *ConfigError
		return errors.As(p, &ce) && slices.Contains([]string{"Pool", "Handlers", "Payloads", "Topic"}, ce.Field)
	})
}

// A change whose two seconds before were a stall is measured against the
// run's own rate up to it, not against the stall: a kill during a stall
// does not "recover" at once.
func TestRecoveryReferenceIsNotAStall(t *testing.T) {
	var series []Sample
	applied := int64(0)
	for i := 0; i <= 60; i++ { // 0.25 s apart
		s := float64(i) / 4
		switch {
		case s <= 4: // 1000 pairs/s
			applied += 250
		case s <= 5.5: // a stall before the change at 6 s...
		case s <= 6: // ...then a trickle: 200 pairs/s
			applied += 50
		case s <= 9: // after the change, the trickle goes on until 9 s
			applied += 50
		default:
			applied += 250
		}
		series = append(series, Sample{Seconds: s, Applied: applied})
	}
	changes := []Change{{Seconds: 6, What: "kill"}}
	recovery(series, changes)
	if got := changes[0].RecoveryMs; got < 3000 {
		t.Errorf("recovery %v ms after a change in a stall, the rate back at 1000/s only 3 s later; want ≥ 3000", got)
	}
}

// A storm with nothing measured shows "–", never 0; the protocols'
// median recovery is over the rounds that measured one; the report says
// how many changes were measured of how many.
func TestRecoveryNothingMeasured(t *testing.T) {
	short := []Sample{{Seconds: 0}, {Seconds: 0.25, Applied: 100}}
	changes := []Change{{Seconds: 0.1, What: "join"}, {Seconds: 0.2, What: "leave"}}
	r1 := RunResult{Name: "storm", Round: 1, Scenario: Storm, GroupProtocol: "classic", EventsPerSec: 100, Series: short,
		Changes: changes, Consumer: &ConsumerStats{}, StormPlanned: 2}
	r1.RecoveryMedianMs, r1.RecoveryMaxMs, r1.RecoveryMeasured = recovery(r1.Series, r1.Changes)
	r2 := RunResult{Name: "storm", Round: 2, Scenario: Storm, GroupProtocol: "classic", EventsPerSec: 110,
		Changes: []Change{{Seconds: 3, What: "join", RecoveryMs: 900}, {Seconds: 5, What: "leave"}}, Consumer: &ConsumerStats{},
		RecoveryMedianMs: 900, RecoveryMaxMs: 900, StormPlanned: 2}
	r2.RecoveryMeasured = 1
	res := &Results{Runs: []RunResult{r1, r2}}
	ps := summarizeProtocols(res, []processor.GroupProtocol{processor.ClassicProtocol})
	if got := ps[0].StormRecoveryMs; got != 900 {
		t.Errorf("protocols' storm recovery %v ms, want 900: the round with nothing measured left out", got)
	}
	res.Protocols = ps
	dir := t.TempDir()
	if err := res.WriteFiles(dir, "onceflow bench"); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	for _, w := range []string{"| storm | 1 | 100 |", "| – (0 of 2 measured) |", "| 900 / 900 (1 of 2 measured) |", "recovery median / max ms (n of m measured)",
		"not measured"} {
		if !strings.Contains(string(md), w) {
			t.Errorf("results.md lacks %q:\n%s", w, md)
		}
	}
	if strings.Contains(string(md), "| 0 / 0 |") {
		t.Errorf("results.md shows 0 / 0 for a storm with nothing measured:\n%s", md)
	}
}

// The tables' check says which check each table passed, and a column
// that differs from effects-only's fails the same way in a table with
// numeric columns as in one without, naming the column, in plain words.
func TestCheckSaysWhichCheck(t *testing.T) {
	ref := map[string]TableState{
		"counters": {Rows: 2, Digest: "20", Sums: map[string]string{"shard": "1", "n": "3"}},
		"payments": {Rows: 3, Digest: "10", Sums: map[string]string{"amount": "30"}, Columns: map[string]string{"paid_at": "5", "account": "7"}},
		"notes":    {Rows: 3, Digest: "40", Columns: map[string]string{"what": "8"}},
	}
	got := map[string]TableState{
		"counters": {Rows: 3, Digest: "21", Sums: map[string]string{"shard": "1", "n": "3"}},
		"payments": {Rows: 3, Digest: "11", Sums: map[string]string{"amount": "30"}, Columns: map[string]string{"paid_at": "6", "account": "7"}},
		"notes":    {Rows: 3, Digest: "41", Columns: map[string]string{"what": "9"}},
	}
	ps, how := compareTables(got, ref)
	if how["counters"] != CheckSums {
		t.Errorf("counters passed by %q, want %q", how["counters"], CheckSums)
	}
	if _, ok := how["payments"]; ok {
		t.Errorf("payments with paid_at differing passed by %q", how["payments"])
	}
	text := strings.Join(ps, "\n")
	for _, w := range []string{"table payments has other contents than effects-only wrote (3 rows both): column paid_at holds other values",
		"table notes has other contents than effects-only wrote (3 rows both): column what holds other values", "now()"} {
		if !strings.Contains(text, w) {
			t.Errorf("problems %q lack %q", ps, w)
		}
	}
	if strings.Contains(text, "map[") {
		t.Errorf("problems show Go internals: %q", ps)
	}
	same := map[string]TableState{"notes": ref["notes"]}
	if ps, how := compareTables(same, map[string]TableState{"notes": ref["notes"]}); len(ps) != 0 || how["notes"] != CheckDigest {
		t.Errorf("the same table: problems %q, check %q; want none, %q", ps, how["notes"], CheckDigest)
	}
}

// Compare names the settings that differ, rounds included; the price
// line with two protocols says whose it is.
func TestCompareAndPriceLine(t *testing.T) {
	old := &Results{Settings: Settings{Rounds: 2}, Summary: []Line{{Name: "steady", EventsPerSec: 100}}}
	cur := &Results{Settings: Settings{Rounds: 1}, Summary: []Line{{Name: "steady", EventsPerSec: 110}}}
	var b bytes.Buffer
	if err := Compare(&b, old, cur); err != nil || !strings.Contains(b.String(), "rounds 2 → 1") {
		t.Errorf("Compare: %v\n%s\nwant rounds 2 → 1", err, b.String())
	}
	// Results from before bench measured the baselines' writers wrote on
	// the pool's connections.
	old.Settings.PoolSize, cur.Settings.PoolSize = 4, 4
	cur.Settings.BaselineWriters = map[string]int{EffectsOnly: 2, RawCopy: 4}
	b.Reset()
	if err := Compare(&b, old, cur); err != nil || !strings.Contains(b.String(), "baseline_writers effects-only 4, raw-copy 4 → effects-only 2, raw-copy 4") {
		t.Errorf("Compare: %v\n%s\nwant baseline_writers effects-only 4, raw-copy 4 → effects-only 2, raw-copy 4", err, b.String())
	}
	cur.Settings.BaselineWriters = nil
	// Results from before bench said where the redeliveries went sent a
	// third of them elsewhere; a share is the one that applied.
	old.Settings.Duplicates, old.Settings.Partitions = 0.3, 12
	cur.Settings.Duplicates, cur.Settings.Partitions = 0.3, 12
	cur.Settings.OtherPartition = new(0.0)
	b.Reset()
	if err := Compare(&b, old, cur); err != nil || !strings.Contains(b.String(), "other_partition 33.3 % → 0 %") {
		t.Errorf("Compare: %v\n%s\nwant other_partition 33.3 %% → 0 %%", err, b.String())
	}
	cur.Settings.OtherPartition = new(DefaultOtherPartition)
	b.Reset()
	if err := Compare(&b, old, cur); err != nil || strings.Contains(b.String(), "other_partition") {
		t.Errorf("Compare: %v\n%s\nwant no other_partition: both sent a third", err, b.String())
	}
	cur.Settings.Partitions, cur.Settings.OtherPartition = 1, new(1.0)
	old.Settings.Partitions = 1
	b.Reset()
	if err := Compare(&b, old, cur); err != nil || strings.Contains(b.String(), "other_partition") {
		t.Errorf("Compare: %v\n%s\nwant no other_partition: one partition has no other", err, b.String())
	}
	old.Settings.Duplicates, old.Settings.Partitions = 0, 0
	cur.Settings.Duplicates, cur.Settings.Partitions, cur.Settings.OtherPartition = 0, 0, nil
	old.Settings.GroupProtocols, cur.Settings.GroupProtocols = []string{"classic"}, []string{"classic", "consumer"}
	b.Reset()
	if err := Compare(&b, old, cur); err != nil || !strings.Contains(b.String(), "group_protocols classic → classic,consumer") {
		t.Errorf("Compare: %v\n%s\nwant group_protocols classic → classic,consumer (as the flag takes them)", err, b.String())
	}
	two := &Results{Settings: Settings{GroupProtocols: []string{"classic", "consumer"}},
		Summary: []Line{{Name: EffectsOnly, EventsPerSec: 100}, {Name: "steady-classic", EventsPerSec: 50}, {Name: "steady-consumer", EventsPerSec: 40}}}
	summarizePrices(two)
	line := two.PriceLine()
	for _, w := range []string{"classic", "50.0 %", "consumer", "60.0 %"} {
		if !strings.Contains(line, w) {
			t.Errorf("price line %q lacks %q", line, w)
		}
	}
	if strings.Contains(line, "below zero") {
		t.Errorf("price line %q says below zero", line)
	}
	// Steady faster than effects-only under one protocol: the line says
	// why a price can be negative.
	two.Summary[2].EventsPerSec = 120
	summarizePrices(two)
	if line := two.PriceLine(); !strings.Contains(line, "-20.0 % (consumer)") || !strings.Contains(line, "below zero: effects-only was the slower") {
		t.Errorf("price line %q: want consumer's -20.0 %% and why it is below zero", line)
	}
}

// Compare says a changed scenario list, compares the storm's settings
// only when both ran a storm, and pairs a run named without a protocol
// with the other side's run of that protocol, saying so; from the runs'
// fields, or from the names alone in a results.json without them.
func TestCompareScenariosAndProtocols(t *testing.T) {
	all := &Results{Settings: Settings{StormChanges: 12, GroupProtocols: []string{"classic"}},
		Summary: []Line{{Name: EffectsOnly, EventsPerSec: 200}, {Name: "steady", EventsPerSec: 100}, {Name: "storm", EventsPerSec: 80}, {Name: "replay", EventsPerSec: 90}}}
	steadyOnly := &Results{Settings: Settings{GroupProtocols: []string{"classic"}},
		Summary: []Line{{Name: EffectsOnly, EventsPerSec: 200}, {Name: "steady", EventsPerSec: 110}}}
	var b bytes.Buffer
	if err := Compare(&b, all, steadyOnly); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); !strings.Contains(got, "scenarios steady, storm, replay → steady") || strings.Contains(got, "storm_changes") {
		t.Errorf("Compare:\n%s\nwant the scenario lists' difference and no storm_changes", got)
	}
	stormy := &Results{Settings: Settings{StormChanges: 4, GroupProtocols: []string{"classic"}}, Summary: []Line{{Name: "storm", EventsPerSec: 80}}}
	b.Reset()
	if err := Compare(&b, all, stormy); err != nil || !strings.Contains(b.String(), "storm_changes 12 → 4") {
		t.Errorf("Compare: %v\n%s\nwant storm_changes 12 → 4", err, b.String())
	}

	both := &Results{Settings: Settings{GroupProtocols: []string{"classic", "consumer"}},
		Summary: []Line{{Name: "steady-classic", EventsPerSec: 100}, {Name: "steady-consumer", EventsPerSec: 120}}}
	withRuns := *both
	withRuns.Runs = []RunResult{{Name: "steady-classic", Scenario: Steady, GroupProtocol: "classic"}, {Name: "steady-consumer", Scenario: Steady, GroupProtocol: "consumer"}}
	classic := &Results{Settings: Settings{GroupProtocols: []string{"classic"}}, Summary: []Line{{Name: "steady", EventsPerSec: 150}},
		Runs: []RunResult{{Name: "steady", Scenario: Steady, GroupProtocol: "classic"}}}
	for name, old := range map[string]*Results{"by the runs": &withRuns, "by the names": both} {
		b.Reset()
		if err := Compare(&b, old, classic); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(strings.Fields(b.String()), " ") // the table's columns aligned or not
		for _, w := range []string{"steady / steady-classic 100 150 +50.0 %", "steady-consumer 120 -",
			"paired by scenario and group protocol: steady now with steady-classic before (both classic)"} {
			if !strings.Contains(got, w) {
				t.Errorf("%s: Compare:\n%s\nwant %q", name, got, w)
			}
		}
		if strings.Contains(got, "scenarios") {
			t.Errorf("%s: Compare:\n%s\nsays the scenarios differ; both ran steady", name, got)
		}
	}
}

// Plots of an earlier run in --out that this run does not make are
// removed: the folder shows one run. A file of the user's named like
// them but not as bench names its plots stays.
func TestWriteFilesRemovesOldPlots(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "throughput-storm-consumer-r1.png")
	mine := []string{filepath.Join(dir, "throughput-mine.png"), filepath.Join(dir, "throughput-steady-r1-zoomed.png")}
	for _, f := range append([]string{old}, mine...) {
		if err := os.WriteFile(f, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, f := range mine {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("a file of the user's: %v", err)
			}
		}
	}()
	res := &Results{Runs: []RunResult{{Name: "steady", Round: 1, Scenario: Steady, Series: []Sample{{Seconds: 0}, {Seconds: 1, Committed: 10}}}}}
	if err := res.WriteFiles(dir, "onceflow bench"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err == nil {
		t.Errorf("%s left from an earlier run", old)
	}
}

// A storm's changes never bunch and are never made after the stream has
// been consumed: on a stream too fast for its planned changes, each is
// made at least stormSpacing after the previous one returned and before
// the run's last commit; those that did not fit are said, not made.
func TestStormChangesKeepApartAndWithinTheStream(t *testing.T) {
	res := paymentsRun(t, Config{Events: 3000, Partitions: 4, Members: 2, Scenarios: []string{Storm}, NoRawCopy: true, StormChanges: 6})
	r := res.Runs[1]
	if r.Name != Storm {
		t.Fatalf("run %s, want storm", r.Name)
	}
	for i, c := range r.Changes {
		if c.Seconds > r.Seconds {
			t.Errorf("change %d (%s) made at %.3fs, after the stream's last commit at %.3fs", i+1, c.What, c.Seconds, r.Seconds)
		}
		if i > 0 {
			p := r.Changes[i-1]
			if gap := c.Seconds - (p.Seconds + p.Took); gap < stormSpacing.Seconds()-0.01 {
				t.Errorf("change %d made %.3fs after change %d returned, want at least %v", i+1, gap, i, stormSpacing)
			}
		}
	}
	if short := len(r.Changes) < r.StormPlanned; short != r.StormShort {
		t.Errorf("%d of %d changes made, StormShort %v", len(r.Changes), r.StormPlanned, r.StormShort)
	}
	if r.StormShort {
		want := fmt.Sprintf("%d of %d changes made before the stream ended", len(r.Changes), r.StormPlanned)
		if got := changeKinds(r); !strings.Contains(got, want) || !strings.Contains(got, "raise --events") {
			t.Errorf("changes cell %q, want it to say %q and raise --events", got, want)
		}
	}
}

// A change in the run's first two seconds, before a two-second window
// exists, is measured against the run's median rate up to it.
func TestRecoveryEarlyChange(t *testing.T) {
	var series []Sample
	applied := int64(0)
	for i := 0; i <= 24; i++ { // 0.25 s apart
		s := float64(i) / 4
		if s > 0 && (s <= 1 || s > 2.5) { // 1000 pairs/s, a stall from 1 s to 2.5 s
			applied += 250
		}
		series = append(series, Sample{Seconds: s, Applied: applied})
	}
	changes := []Change{{Seconds: 1, What: "kill"}}
	if _, _, n := recovery(series, changes); n != 1 || changes[0].RecoveryMs < 1500 {
		t.Errorf("a change at 1 s: %d measured, recovery %v ms; want it measured, ≥ 1500 ms", n, changes[0].RecoveryMs)
	}
}

// recorder is a handler that keeps the topics it was given, and filters
// topics when only is set.
type recorder struct {
	topics []string
	only   string
}

func (r *recorder) Name() string { return "recorder" }
func (r *recorder) Apply(_ context.Context, _ pgx.Tx, evs []sink.Event) error {
	for _, e := range evs {
		r.topics = append(r.topics, e.Topic)
	}
	return nil
}

type filtering struct{ *recorder }

func (f filtering) Consumes(topic string) bool { return topic == f.only }

// On real brokers the handlers see the config's topic: their events'
// Topic is it, a topic filter is asked about it, and a handler that
// filters no topic does not become one that does.
func TestTopicAs(t *testing.T) {
	plain, filt := &recorder{}, filtering{&recorder{only: "payments"}}
	hs := topicAs([]sink.Handler{plain, filt}, "payments")
	evs := []sink.Event{{Topic: "payments-bench-1a2b"}, {Topic: "payments-bench-1a2b"}}
	for _, h := range hs {
		if err := h.Apply(t.Context(), nil, evs); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(append(plain.topics, filt.topics...), ","); got != "payments,payments,payments,payments" {
		t.Errorf("handlers saw topics %s, want payments each", got)
	}
	if evs[0].Topic != "payments-bench-1a2b" {
		t.Errorf("the batch's events were changed: %s", evs[0].Topic)
	}
	if _, ok := hs[0].(sink.TopicFilter); ok {
		t.Errorf("a handler without a topic filter became one")
	}
	if f, ok := hs[1].(sink.TopicFilter); !ok || !f.Consumes("payments-bench-1a2b") {
		t.Errorf("the filtering handler does not consume bench's topic standing for payments")
	}
}

// With two rounds the line's rate is the lower round, and results.md
// says so.
func TestMedianOfTwoRoundsIsTheLower(t *testing.T) {
	res := &Results{Settings: Settings{Rounds: 2}, Runs: []RunResult{{Name: Steady, Round: 1, EventsPerSec: 200}, {Name: Steady, Round: 2, EventsPerSec: 100}}}
	summarize(res, Steady)
	if got := res.Summary[0].EventsPerSec; got != 100 {
		t.Errorf("median of 200 and 100: %v, want 100", got)
	}
	dir := t.TempDir()
	if err := res.WriteFiles(dir, "onceflow bench"); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "the median of 2 rounds, of an even number the lower of the middle two") {
		t.Errorf("results.md does not say which round of two:\n%s", md)
	}
}

// Counts agree with their nouns: one partition, 2 joins.
func TestCountsAgree(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{count(1, "partition"), "1 partition"},
		{count(12, "partition"), "12 partitions"},
		{count(0, "redelivery", "redeliveries"), "0 redeliveries"},
		{changeKinds(RunResult{Changes: []Change{{What: "join"}, {What: "join"}, {What: "leave"}}}), "2 joins, 1 leave"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
