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
			return []sink.Handler{sqlHandler(t, "payments", paymentsSQL)}, nil
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
		if r.Name == Storm && len(r.Changes) == 0 {
			t.Errorf("storm: no membership change")
		}
		if r.Name == Replay && (len(r.Changes) != 1 || r.Records <= 520) {
			t.Errorf("replay: changes %v, %d records read; want a restart and more than the 520 records", r.Changes, r.Records)
		}
		if st := r.Tables["payments"]; st.Rows != 400 {
			t.Errorf("%s: payments has %d rows, want 400", r.Name, st.Rows)
		}
	}
	if !res.HasPrice || !strings.Contains(res.PriceLine(), "price of exactly-once: 1 − steady/effects-only = ") {
		t.Fatalf("price line %q", res.PriceLine())
	}
	if after := userRows(t, up, us); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("the user's payments changed: before %v after %v", before, after)
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
		Scenarios: []string{Steady}, NoBaselines: true, Schema: prefix, Keep: true,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() {
		for _, r := range res.Runs {
			_, _ = up.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+r.Schema+" CASCADE")
		}
	})
	ref := res.Runs[0].Tables
	schema := res.Runs[1].Schema
	pay := pgx.Identifier{schema, "payments"}.Sanitize()
	for _, q := range []string{
		"INSERT INTO " + pay + " SELECT * FROM " + pay + " LIMIT 1",
		"DELETE FROM " + pgx.Identifier{schema, "processed_events"}.Sanitize() + " WHERE event_id = (SELECT event_id FROM " + pay + " ORDER BY event_id LIMIT 1)",
	} {
		if _, err := up.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	got, err := effects(ctx, up, schema, []string{"payments"})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := check(ctx, up, schema, []string{"payments"}, 50, true, got, ref)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"handler payments claimed 49 events, want the 50 unique ones", "table payments has 51 rows, effects-only wrote 50"}
	if strings.Join(ps, "\n") != strings.Join(want, "\n") {
		t.Fatalf("check = %q, want %q", ps, want)
	}
	// The same rows count but a changed row: the digest says so.
	if _, err := up.Exec(ctx, "DELETE FROM "+pay+" WHERE ctid = (SELECT max(ctid) FROM "+pay+")"); err != nil {
		t.Fatal(err)
	}
	if _, err := up.Exec(ctx, "UPDATE "+pay+" SET amount = amount + 1 WHERE ctid = (SELECT min(ctid) FROM "+pay+")"); err != nil {
		t.Fatal(err)
	}
	got, _ = effects(ctx, up, schema, []string{"payments"})
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
