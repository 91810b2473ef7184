package bench

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/sink"
)

func TestWriterCounts(t *testing.T) {
	for pool, want := range map[int][]int{1: {1}, 2: {2, 1}, 3: {3, 1}, 4: {4, 2, 1}, 10: {10, 5, 2, 1}} {
		if got := writerCounts(pool); !slices.Equal(got, want) {
			t.Errorf("writerCounts(%d) = %v, want %v", pool, got, want)
		}
	}
}

// Before the rounds, each baseline is timed on the pool's writers, half
// of them and one, over the stream's first events, and writes its rounds
// on the fastest, which the results and the progress say; BaselineWriters
// sets them instead, with nothing timed.
func TestRunCalibratesBaselineWriters(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	// Hot rows: a counter per partition, upserted by every batch.
	if _, err := up.Exec(ctx, `CREATE TABLE counters (shard int PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const countersSQL = `INSERT INTO counters AS c SELECT partition, count(*) FROM events GROUP BY 1 ORDER BY 1
ON CONFLICT (shard) DO UPDATE SET n = c.n + EXCLUDED.n`
	tm, err := ParseTemplate([]byte(paymentTemplate))
	if err != nil {
		t.Fatal(err)
	}
	run := func(writers int) (*Results, string) {
		t.Helper()
		var progress bytes.Buffer
		res, err := Run(ctx, Config{
			Pool: up,
			Handlers: func(string) ([]sink.Handler, error) {
				return []sink.Handler{sqlHandler(t, "payments", paymentsSQL), sqlHandler(t, "counters", countersSQL)}, nil
			},
			Topic: "payments", Payloads: FromTemplate(tm), Events: MinCalibrationEvents, Partitions: 4, Members: 1,
			Scenarios: []string{Steady}, PoolSize: 4, BaselineWriters: writers, Schema: us + "_c", Progress: &progress,
			Checkpoint: true,
		})
		if err != nil {
			t.Fatalf("Run: %v\n%s", err, progress.String())
		}
		return res, progress.String()
	}

	before, err := checkpoints(ctx, up)
	if err != nil {
		t.Fatal(err)
	}
	res, progress := run(0)
	st := res.Settings
	// Each candidate starts after a CHECKPOINT, as each round does, and
	// the results say so.
	if !strings.Contains(progress, "each after a CHECKPOINT") || slices.ContainsFunc(st.Calibration, func(c Calibration) bool { return !c.FromCheckpoint }) {
		t.Errorf("calibration %+v, progress:\n%s\nwant each candidate from a checkpoint, said", st.Calibration, progress)
	}
	if after, err := checkpoints(ctx, up); err != nil {
		t.Fatal(err)
	} else if want := int64(len(st.Calibration) + len(res.Runs)); after-before < want {
		t.Errorf("%d checkpoints begun during the run, want at least %d: one before each of %d candidates and %d runs", after-before, want, len(st.Calibration), len(res.Runs))
	}
	for _, name := range []string{EffectsOnly, RawCopy} {
		var tried []int
		best, rate := 0, 0.0
		for _, c := range st.Calibration {
			if c.Baseline != name {
				continue
			}
			tried = append(tried, c.Writers)
			if c.Events != MinCalibrationEvents || c.EventsPerSec <= 0 {
				t.Errorf("%s on %d writers: %d events at %.0f events/s", name, c.Writers, c.Events, c.EventsPerSec)
			}
			if c.EventsPerSec > rate {
				best, rate = c.Writers, c.EventsPerSec
			}
		}
		if !slices.Equal(tried, []int{4, 2, 1}) {
			t.Errorf("%s timed on %v writers, want 4, 2, 1", name, tried)
		}
		if st.BaselineWriters[name] != best {
			t.Errorf("%s writes on %d writers, the fastest timed %d", name, st.BaselineWriters[name], best)
		}
		for _, r := range res.Runs {
			if r.Name == name && r.Writers != best {
				t.Errorf("%s round %d wrote on %d writers, want %d", name, r.Round, r.Writers, best)
			}
		}
	}
	if !strings.Contains(progress, "baselines' writers (the fastest over the first ") {
		t.Errorf("the progress does not say the baselines' writers:\n%s", progress)
	}

	if st.BaselineWritersBy != "measured" {
		t.Errorf("baseline writers by %q, want measured", st.BaselineWritersBy)
	}

	res, progress = run(1)
	if res.Settings.BaselineWritersBy != "set" || !strings.Contains(progress, "baselines' writers (as set): effects-only 1; raw-copy 1") {
		t.Errorf("BaselineWriters 1: by %q, progress:\n%s", res.Settings.BaselineWritersBy, progress)
	}
	if len(res.Settings.Calibration) != 0 || res.Settings.BaselineWriters[EffectsOnly] != 1 || res.Settings.BaselineWriters[RawCopy] != 1 {
		t.Errorf("BaselineWriters 1: calibration %v, writers %v; want none timed, 1 each", res.Settings.Calibration, res.Settings.BaselineWriters)
	}
	for _, r := range res.Runs {
		if (r.Name == EffectsOnly || r.Name == RawCopy) != (r.Writers == 1) {
			t.Errorf("BaselineWriters 1: %s wrote on %d writers", r.Name, r.Writers)
		}
	}
	if strings.Contains(progress, "the fastest over") || strings.Contains(progress, " on 4 writers") {
		t.Errorf("BaselineWriters 1, and the progress says writers were timed:\n%s", progress)
	}
}
