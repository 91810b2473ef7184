package bench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/sink"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const paymentTemplate = `{"account": "acct-{{int 1 50}}", "amount": "{{string decimal 0.01 999.99 2}}", "currency": "{{choice 'EUR' 'USD'}}"}`

// A small run of every scenario and both baselines on kfake and the test
// Postgres: each run exactly once, the user's table untouched, the
// schemas dropped, the report complete.
func TestRunSmall(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	// A second handler keeps a counter per partition: its rows depend on
	// which delivery of an event was applied, their sum does not.
	if _, err := up.Exec(ctx, `CREATE TABLE counters (shard int PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const countersSQL = `INSERT INTO counters AS c SELECT partition, count(*) FROM events GROUP BY 1
ON CONFLICT (shard) DO UPDATE SET n = c.n + EXCLUDED.n`
	before := userRows(t, up, us)
	tm, err := ParseTemplate([]byte(paymentTemplate))
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	prefix := us + "_b"
	res, err := Run(ctx, Config{
		Pool: up,
		Handlers: func(string) ([]sink.Handler, error) {
			return []sink.Handler{sqlHandler(t, "payments", paymentsSQL), sqlHandler(t, "counters", countersSQL)}, nil
		},
		Topic: "payments", Payloads: FromTemplate(tm),
		Events: 400, Duplicates: 0.3, Partitions: 4, Members: 2, StormEvery: 700 * time.Millisecond,
		Schema: prefix, Progress: &progress,
	})
	t.Log(progress.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var names []string
	for _, l := range res.Summary {
		names = append(names, l.Name)
		if !l.ExactlyOnce || l.EventsPerSec <= 0 {
			t.Errorf("%s: exactly once %v, %.0f events/s", l.Name, l.ExactlyOnce, l.EventsPerSec)
		}
		if l.VsEffects <= 0 || l.VsRawCopy <= 0 {
			t.Errorf("%s: ratios %v %v, want both", l.Name, l.VsEffects, l.VsRawCopy)
		}
	}
	if got, want := strings.Join(names, ","), "effects-only,raw-copy,steady,storm,replay"; got != want {
		t.Fatalf("summary %s, want %s", got, want)
	}
	for _, r := range res.Runs {
		if scenario := r.Name != EffectsOnly && r.Name != RawCopy; scenario != (r.Consumer != nil) ||
			scenario && (r.Consumer.Batches == 0 || r.Consumer.RecordsConsumed < 520) {
			t.Errorf("%s: consumer stats %+v", r.Name, r.Consumer)
		}
		if r.Name == Storm && len(r.Changes) == 0 && !r.StormShort {
			t.Errorf("storm: no membership change, and the stream's end not said")
		}
		if r.Name == Replay && (len(r.Changes) != 1 || r.Records <= 520) {
			t.Errorf("replay: changes %v, %d records read; want a restart and more than the 520 records", r.Changes, r.Records)
		}
		if st := r.Tables["payments"]; st.Rows != 400 {
			t.Errorf("%s: payments has %d rows, want 400", r.Name, st.Rows)
		}
		if st := r.Tables["counters"]; st.Sums["n"] != "400" {
			t.Errorf("%s: counters sum to %s, want 400 (tables %v)", r.Name, st.Sums["n"], r.Tables)
		}
	}
	if !res.HasPrice || !strings.Contains(res.PriceLine(), "price of exactly-once: 1 − steady/effects-only = ") {
		t.Fatalf("price line %q", res.PriceLine())
	}
	if after := userRows(t, up, us); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("the user's payments changed: before %v after %v", before, after)
	}
	var counters int
	if err := up.QueryRow(ctx, `SELECT count(*) FROM counters`).Scan(&counters); err != nil || counters != 0 {
		t.Fatalf("the user's counters has %d rows (%v), want none", counters, err)
	}
	var left int
	if err := up.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, prefix+"%").Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d bench schemas left (%v), want none", left, err)
	}
	dir := t.TempDir()
	if err := res.WriteFiles(dir, "onceflow bench"); err != nil {
		t.Fatal(err)
	}
	old, err := ReadResults(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"throughput-steady-r1.png", "throughput-storm-r1.png", "throughput-replay-r1.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("no plot: %v", err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	if !strings.Contains(string(md), res.PriceLine()) {
		t.Fatalf("results.md lacks the price line:\n%s", md)
	}
	var cmp bytes.Buffer
	if err := Compare(&cmp, old, res); err != nil || !strings.Contains(cmp.String(), "+0.0 %") {
		t.Fatalf("Compare with itself: %v\n%s", err, cmp.String())
	}
}

// The check sees a doubled effect and a missing claim.
func TestCheckSeesDoubles(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	tm, _ := ParseTemplate([]byte(paymentTemplate))
	prefix := us + "_k"
	res, err := Run(ctx, Config{
		Pool: up,
		Handlers: func(string) ([]sink.Handler, error) {
			return []sink.Handler{sqlHandler(t, "payments", paymentsSQL)}, nil
		},
		Topic: "payments", Payloads: FromTemplate(tm), Events: 50, Partitions: 2, Members: 1,
		Scenarios: []string{Steady}, NoRawCopy: true, Schema: prefix, Keep: true,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() {
		for _, s := range res.Schemas {
			_, _ = up.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+s+" CASCADE")
		}
	})
	ref := res.Runs[0].Tables
	schema, tables := res.Runs[1].Schema, res.Runs[1].TablesSchema
	pay := pgx.Identifier{tables, "payments"}.Sanitize()
	for _, q := range []string{
		"INSERT INTO " + pay + " SELECT * FROM " + pay + " LIMIT 1",
		"DELETE FROM " + pgx.Identifier{schema, "processed_events"}.Sanitize() + " WHERE event_id = (SELECT event_id FROM " + pay + " ORDER BY event_id LIMIT 1)",
	} {
		if _, err := up.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	got, err := effects(ctx, up, tables, []string{"payments"})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := check(ctx, up, schema, []string{"payments"}, 50, true, got, ref)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"handler payments claimed 49 events, want the 50 unique ones", "table payments has 51 rows, effects-only wrote 50: column amount sums to "}
	if len(ps) != 2 || ps[0] != want[0] || !strings.HasPrefix(ps[1], want[1]) {
		t.Fatalf("check = %q, want %q", ps, want)
	}
	// The same rows count but a changed row: the digest says so.
	if _, err := up.Exec(ctx, "DELETE FROM "+pay+" WHERE ctid = (SELECT max(ctid) FROM "+pay+")"); err != nil {
		t.Fatal(err)
	}
	if _, err := up.Exec(ctx, "UPDATE "+pay+" SET amount = amount + 1 WHERE ctid = (SELECT min(ctid) FROM "+pay+")"); err != nil {
		t.Fatal(err)
	}
	got, _ = effects(ctx, up, tables, []string{"payments"})
	ps, _ = check(ctx, up, schema, []string{"payments"}, 50, false, got, ref)
	if len(ps) != 1 || !strings.Contains(ps[0], "other contents than effects-only wrote") {
		t.Fatalf("check after a changed row = %q", ps)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	_, err := Run(t.Context(), Config{Events: -1, Scenarios: []string{"sprint"}, Schema: "Bad-Name"})
	for _, w := range []string{"no Pool", "no Handlers", "no Payloads", "no Topic", "Events -1", `unknown scenario "sprint"`, `Schema "Bad-Name"`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Run with a bad config: %v; want it to say %q", err, w)
		}
	}
	var re *RefusedError
	if errors.As(err, &re) {
		t.Fatal("a config error is not a refusal")
	}
}

// The tables' comparison with effects-only: the same rows, or for rows
// that depend on the delivery, the same sums of the numeric columns.
func TestCheckComparesTables(t *testing.T) {
	ref := map[string]TableState{
		"emails":   {Rows: 3, Digest: "10"},
		"counters": {Rows: 2, Digest: "20", Sums: map[string]string{"shard": "1", "n": "3"}},
	}
	tests := []struct {
		name string
		got  map[string]TableState
		want string // a problem's text; empty: none
	}{
		{"same", ref, ""},
		{"counters by other shards, same totals", map[string]TableState{"emails": ref["emails"],
			"counters": {Rows: 3, Digest: "21", Sums: map[string]string{"shard": "1", "n": "3"}}}, "must not differ"},
		{"a doubled email", map[string]TableState{"emails": {Rows: 4, Digest: "11"}, "counters": ref["counters"]},
			"table emails has 4 rows, effects-only wrote 3"},
		{"an email changed", map[string]TableState{"emails": {Rows: 3, Digest: "11"}, "counters": ref["counters"]},
			"table emails has other contents"},
		{"a counter doubled", map[string]TableState{"emails": ref["emails"],
			"counters": {Rows: 2, Digest: "22", Sums: map[string]string{"shard": "1", "n": "4"}}}, "table counters has other contents"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := check(t.Context(), nil, "s", nil, 3, false, tt.got, ref)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.want == "" || tt.want == "must not differ":
				if len(ps) != 0 {
					t.Fatalf("check = %q, want no problem", ps)
				}
			case len(ps) != 1 || !strings.Contains(ps[0], tt.want):
				t.Fatalf("check = %q, want one problem saying %q", ps, tt.want)
			}
		})
	}
}

// Two benchmarks on one database at once, with the same schema prefix,
// keep apart: each run exactly once, and neither drops the other's
// schemas.
func TestRunTwoAtOnce(t *testing.T) {
	up, us, _ := userDB(t)
	tm, _ := ParseTemplate([]byte(paymentTemplate))
	prefix := us + "_t"
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := Run(t.Context(), Config{
				Pool: up,
				Handlers: func(string) ([]sink.Handler, error) {
					return []sink.Handler{sqlHandler(t, "payments", paymentsSQL)}, nil
				},
				Topic: "payments", Payloads: FromTemplate(tm), Events: 300, Partitions: 3, Members: 2,
				Scenarios: []string{Steady, Replay}, Schema: prefix,
			})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
