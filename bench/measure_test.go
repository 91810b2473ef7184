package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/sink"
)

// A change's recovery is the time until the applied rate, over half a
// second wholly after it, is back at 90 % of the rate of the two seconds
// before; a change the stream outlives no more is left out.
func TestRecovery(t *testing.T) {
	var series []Sample
	applied := int64(0)
	for i := 0; i <= 40; i++ { // 0.25 s apart
		s := float64(i) / 4
		switch {
		case s <= 3: // 1000 pairs/s before the change at 3 s
			applied += 250
		case s <= 4: // stalled until 4 s
		default:
			applied += 250
		}
		series = append(series, Sample{Seconds: s, Applied: applied})
	}
	changes := []Change{{Seconds: 3, What: "kill"}, {Seconds: 9.9, What: "join"}}
	med, mx, n := recovery(series, changes)
	if changes[0].RecoveryMs < 1000 || changes[0].RecoveryMs > 1750 {
		t.Errorf("recovery %v ms after a change at 3 s with nothing applied until 4 s, want 1000–1750", changes[0].RecoveryMs)
	}
	if changes[1].RecoveryMs != 0 {
		t.Errorf("a change 0.1 s before the end recovered in %v ms, want none measured", changes[1].RecoveryMs)
	}
	if med != changes[0].RecoveryMs || mx != changes[0].RecoveryMs || n != 1 {
		t.Errorf("median %v, max %v, %d measured; want the one measured, %v", med, mx, n, changes[0].RecoveryMs)
	}
	if med, mx, n := recovery(series[:1], []Change{{Seconds: 0, What: "join"}}); med != 0 || mx != 0 || n != 0 {
		t.Errorf("nothing to measure: %v / %v, %d measured; want none", med, mx, n)
	}
}

// The replay's time back at rate is of the records committed: the
// second group's count starts again from zero at the re-read, and is
// measured from there, against the first group's last two seconds.
func TestReplayBackAtRate(t *testing.T) {
	var series []Sample
	add := func(s float64, c int64) { series = append(series, Sample{Seconds: s, Committed: c}) }
	for i := 0; i <= 12; i++ { // the first group: 1000 records/s for 3 s
		add(float64(i)/4, int64(i)*250)
	}
	at := 3.04    // the re-read: the first group has stopped
	add(3.05, 0)  // the second group starts, nothing committed
	add(3.3, 0)   // joining
	add(3.55, 0)  // joining
	c := int64(0) // then 1200 records/s
	for i := 1; i <= 12; i++ {
		c += 300
		add(3.55+float64(i)/4, c)
	}
	ms, ok := backAtRate(series, at, committed, 0)
	// At 1200/s from 3.55 s, the first half second back at 900/s is
	// 3.55–4.05 s: 4.05 − 3.04 s.
	if !ok || ms < 1000 || ms > 1020 {
		t.Errorf("back at rate after %v ms (%v), want 1010", ms, ok)
	}
	if _, ok := backAtRate(series[:15], at, committed, 0); ok {
		t.Errorf("measured a recovery the series does not reach")
	}
	// A run's summary: the median over the rounds, and the storm's
	// recoveries by kind of change.
	back := []float64{900, 1500, 700}
	res := &Results{}
	for i, b := range back {
		res.Runs = append(res.Runs,
			RunResult{Round: i + 1, Scenario: Steady, GroupProtocol: "consumer", EventsPerSec: 100 * float64(i+1)},
			RunResult{Round: i + 1, Scenario: Replay, GroupProtocol: "consumer", EventsPerSec: 95 * float64(i+1), BackAtRateMs: &back[i]},
			RunResult{Round: i + 1, Scenario: Storm, GroupProtocol: "consumer", EventsPerSec: 90 * float64(i+1), RecoveryMedianMs: b, RecoveryMeasured: 2, Changes: []Change{
				{What: "join", RecoveryMs: b}, {What: "kill", RecoveryMs: 3 * b}, {What: "leave"}}})
	}
	ps := summarizeProtocols(res, []processor.GroupProtocol{"consumer"})
	if len(ps) != 1 || ps[0].ReplayBackMs != 900 || ps[0].ReplayBackRounds != 3 {
		t.Fatalf("summary %+v, want the replay back at rate after 900 ms, of 3 rounds", ps)
	}
	if r := ps[0].StormRounds; len(r) != 3 || math.Abs(r[0]-0.9) > 1e-9 || math.Abs(r[2]-0.9) > 1e-9 {
		t.Errorf("storm paired by round %v, want 0.9 in each of 3 rounds (each its round's steady)", r)
	}
	if by := ps[0].StormRecoveryByKind; by["join"] != 900 || by["kill"] != 2700 || len(by) != 2 {
		t.Errorf("storm recovery by kind %v, want join 900, kill 2700 and no leave (none measured)", by)
	}
	var md strings.Builder
	writeProtocols(&md, ps)
	if !strings.Contains(md.String(), "| 190 (0.95×) | 0.95×: 0.95 0.95 0.95 | 900 |") || !strings.Contains(md.String(), "900 (join 900, kill 2700)") {
		t.Errorf("protocols table lacks the replay's time back at rate or the recoveries by change:\n%s", md.String())
	}
}

func TestPercentileMs(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p50, p99 := percentileMs(ds, 0.5), percentileMs(ds, 0.99); p50 != 51 || p99 != 100 {
		t.Errorf("p50 %v p99 %v, want 51 and 100", p50, p99)
	}
	if p := percentileMs(nil, 0.5); p != 0 {
		t.Errorf("of none: %v", p)
	}
}

// What the project's figures need beyond the rates, on a small run: a
// CHECKPOINT before each run and the checkpoints during it counted, batch
// latency and peak RSS, a storm of exactly its planned changes (a join, a
// leave, a kill, ...: spread over the stream, every one is made) with
// their recoveries and the partitions' waits with no owner, a CPU profile
// of the steady run, all in results.md.
func TestRunMeasures(t *testing.T) {
	var prof bytes.Buffer
	res := paymentsRunSQL(t, Config{
		Events: 6000, Partitions: 6, Members: 2, Scenarios: []string{Steady, Storm}, NoRawCopy: true,
		StormChanges: 4, Checkpoint: true, CPUProfile: &prof, // the changes spread over the stream
		// Small paced batches keep the stream going while the storm
		// changes: the last fifth takes a second at least, where the
		// storm sees the share of its last change within 0.3 s.
		Consumer: processor.Config{BatchMaxRecords: 20},
	}, pacedPaymentsSQL)
	for _, r := range res.Runs {
		if !r.FromCheckpoint || r.Checkpoints == nil {
			t.Errorf("%s: from a checkpoint %v, checkpoints %v; want a CHECKPOINT before it and a count", r.Name, r.FromCheckpoint, r.Checkpoints)
		}
		if r.PeakRSSMiB <= 0 {
			t.Errorf("%s: peak RSS %v MiB", r.Name, r.PeakRSSMiB)
		}
		if r.Name == EffectsOnly {
			continue
		}
		if r.BatchP50Ms <= 0 || r.BatchP99Ms < r.BatchP50Ms {
			t.Errorf("%s: batch latency p50 %v p99 %v ms", r.Name, r.BatchP50Ms, r.BatchP99Ms)
		}
		if r.NoOwner == nil {
			t.Errorf("%s: no waits with no owner measured", r.Name)
		}
		if r.Name != Storm {
			continue
		}
		var kinds []string
		for _, c := range r.Changes {
			kinds = append(kinds, c.What)
		}
		if want := []string{"join", "leave", "kill", "join"}; !slices.Equal(kinds, want) || r.StormPlanned != 4 || r.StormShort {
			t.Errorf("storm changes %v of %d planned (short %v), want %v", kinds, r.StormPlanned, r.StormShort, want)
		}
		if r.NoOwner.Waits == 0 {
			t.Errorf("storm: a kill and a leave, and no partition waited with no owner: %+v", r.NoOwner)
		}
	}
	if !bytes.HasPrefix(prof.Bytes(), []byte{0x1f, 0x8b}) {
		t.Errorf("the CPU profile is not a gzipped pprof (%d bytes)", prof.Len())
	}
	dir := t.TempDir()
	if err := res.WriteFiles(dir, "onceflow bench"); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	for _, w := range []string{"batch p50 / p99 ms", "recovery median / max ms", "waits with no owner", "each run starts right after a CHECKPOINT", "| storm | 1 |"} {
		if !strings.Contains(string(md), w) {
			t.Errorf("results.md lacks %q:\n%s", w, md)
		}
	}
}

// Bad settings of the new knobs are refused, each named.
func TestValidateMeasures(t *testing.T) {
	c := Config{Pool: nil, Topic: "t", StormChanges: -1, GroupProtocols: []processor.GroupProtocol{"classic", "eager", "classic"},
		InstanceID: true, CPUProfile: &bytes.Buffer{}, CPUProfileOf: "replay", Scenarios: []string{Steady}}
	err := c.Validate()
	for _, w := range []string{"StormChanges -1", `GroupProtocols "eager": classic or consumer`, `GroupProtocols "classic": listed twice`, `CPUProfileOf "replay": not among the scenarios run`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: %v; want %q", err, w)
		}
	}
	c = Config{Topic: "t", InstanceID: true, GroupProtocols: []processor.GroupProtocol{processor.ConsumerProtocol}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "InstanceID with the consumer group protocol needs a real Kafka") {
		t.Errorf("static members under consumer on kfake: %v", err)
	}
}

// With InstanceID the storm's members are static, and its third change
// is a restart under the same id: the report counts the partitions the
// member ran and how many moved to another member meanwhile.
func TestRunStaticStorm(t *testing.T) {
	res := paymentsRunSQL(t, Config{
		// A change a second: the restarted member has had its partitions.
		// Paced batches make the stream last four seconds at least.
		Events: 8000, Partitions: 6, Members: 2, Scenarios: []string{Storm}, NoRawCopy: true,
		StormChanges: 3, StormEvery: time.Second, InstanceID: true,
		Consumer: processor.Config{BatchMaxRecords: 20},
	}, pacedPaymentsSQL)
	r := res.Runs[1]
	if r.Name != Storm || r.StaticMoved == nil {
		t.Fatalf("%s: static moved %v, want a count", r.Name, r.StaticMoved)
	}
	if r.StormShort || len(r.Changes) < 3 {
		t.Fatalf("the stream ran out after %d changes: no restart to look at", len(r.Changes))
	}
	c := r.Changes[2]
	if c.What != "restart" || c.Held == 0 || c.Moved == nil {
		t.Fatalf("third change %+v, want a restart holding partitions, its moved ones counted", c)
	}
	if len(res.Protocols) != 1 || res.Protocols[0].StaticMoved == nil {
		t.Errorf("protocols %+v, want the static restarts summarized", res.Protocols)
	}
}

// With Formats the scenarios run again in Avro, framed for a schema
// registry and read back through it: exactly once, the same tables as
// JSON's, and the report compares the two.
func TestRunFormats(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	rc := registry.Config{URL: fake.URL()}
	enc, err := registry.NewEncoder(t.Context(), rc, "payments-value", registry.Source{Kind: registry.Avro,
		Text: `{"type":"record","name":"Payment","fields":[{"name":"account","type":"string"},{"name":"amount","type":"string"},{"name":"currency","type":"string"}]}`})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := registry.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	res := paymentsRun(t, Config{
		Events: 500, Partitions: 3, Members: 2, Scenarios: []string{Steady}, NoRawCopy: true,
		Formats: []Format{{Name: processor.FormatAvro, Encoder: enc, Decoder: dec}},
	})
	var names []string
	for _, r := range res.Runs {
		names = append(names, r.Name)
	}
	if got, want := strings.Join(names, ","), "effects-only,steady,steady-avro"; got != want {
		t.Fatalf("runs %s, want %s", got, want)
	}
	if r := res.Runs[2]; !r.ExactlyOnce || r.Format != "avro" || r.Consumer.Applied != 500 {
		t.Errorf("steady-avro: exactly once %v, format %q, %d applied: %v", r.ExactlyOnce, r.Format, r.Consumer.Applied, r.Problems)
	}
	if len(res.Formats) != 1 || res.Formats[0].Ratio <= 0 || res.Formats[0].Format != "avro" {
		t.Errorf("format ratios %+v", res.Formats)
	}
	if err := (Config{Topic: "t", Brokers: []string{"b:9092"}, Formats: []Format{{Name: "xml"}}}).Validate(); err == nil ||
		!strings.Contains(err.Error(), `Formats "xml": avro or protobuf`) || !strings.Contains(err.Error(), "Formats with Brokers") {
		t.Errorf("bad formats: %v", err)
	}
}

// paymentsRun runs c over a payments table of a user's schema, with one
// SQL handler and the payments template, and fails t when Run fails.
func paymentsRun(t *testing.T, c Config) *Results {
	t.Helper()
	return paymentsRunSQL(t, c, paymentsSQL)
}

// paymentsRunSQL is paymentsRun with the handler's SQL.
func paymentsRunSQL(t *testing.T, c Config, sql string) *Results {
	t.Helper()
	up, us, _ := userDB(t)
	tm, err := ParseTemplate([]byte(paymentTemplate))
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	c.Pool, c.Topic, c.Payloads, c.Schema, c.Progress = up, "payments", FromTemplate(tm), us+"_b", &progress
	c.Handlers = func(string) ([]sink.Handler, error) {
		return []sink.Handler{sqlHandler(t, "payments", sql)}, nil
	}
	res, err := Run(t.Context(), c)
	t.Log(progress.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}
