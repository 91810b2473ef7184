package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/deploy"
	"github.com/onceflow/onceflow/sink"
)

// EnvPromtool names the environment variable with the path of a promtool
// binary (infra/promtool.sh build prints one). Without it the promtool
// checks skip, unless CI is set: then they fail.
const EnvPromtool = "ONCEFLOW_TEST_PROMTOOL"

func promtool(t *testing.T) string {
	t.Helper()
	p := os.Getenv(EnvPromtool)
	if p == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set and CI is: the alert rules must be checked by promtool (infra/promtool.sh build)", EnvPromtool)
		}
		t.Skipf("%s is not set (infra/promtool.sh build prints the path)", EnvPromtool)
	}
	return p
}

func run(t *testing.T, dir, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

// The rule file is valid, and each alert fires and stays silent as its
// unit tests say, in the promtool the Makefile pins.
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	run(t, "prometheus", bin, "check", "rules", "onceflow-rules.yaml")
	run(t, "prometheus", bin, "test", "rules", "onceflow-rules.test.yaml")
}

// Every alert has unit tests that expect it to fire and not to fire.
func TestEveryAlertIsUnitTested(t *testing.T) {
	rules, err := deploy.Rules()
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("prometheus", "onceflow-rules.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		n := strings.Count(string(tests), "alertname: "+r.Alert+"\n")
		fires := regexp.MustCompile(`alertname: ` + r.Alert + `\n\s+exp_alerts:\n\s+- exp_labels`).MatchString(string(tests))
		silent := strings.Contains(string(tests), "alertname: "+r.Alert+"\n        exp_alerts: []")
		if n < 2 || !fires || !silent {
			t.Errorf("alert %s: %d unit tests, firing %v, silent %v; want one firing and one silent at least", r.Alert, n, fires, silent)
		}
	}
}

// Every alert has a severity, a summary and a description that points at
// a section of docs/operating.md that exists.
func TestAlertsPointAtTheirSection(t *testing.T) {
	rules, err := deploy.Rules()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[anchor(m[1])] = true
	}
	link := regexp.MustCompile(`docs/operating\.md#([a-z0-9_-]+)`)
	if len(rules) == 0 {
		t.Fatal("no rules")
	}
	for _, r := range rules {
		if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
			t.Errorf("alert %s: severity %q, summary %q: want both", r.Alert, r.Labels["severity"], r.Annotations["summary"])
		}
		m := link.FindStringSubmatch(r.Annotations["description"])
		switch {
		case m == nil:
			t.Errorf("alert %s: its description names no section of docs/operating.md", r.Alert)
		case !anchors[m[1]]:
			t.Errorf("alert %s: docs/operating.md has no section #%s", r.Alert, m[1])
		case m[1] != strings.ToLower(r.Alert):
			t.Errorf("alert %s points at #%s, want its own section #%s", r.Alert, m[1], strings.ToLower(r.Alert))
		}
	}
}

// anchor is GitHub's anchor of a heading (as docs/docs_test.go computes it).
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Each dashboard expression parses as PromQL: promtool checks a rule file
// with one recording rule per expression, in a group named after its
// panel and query, so an error names the panel.
func TestDashboardExpressionsParse(t *testing.T) {
	exprs, err := deploy.DashboardExprs()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("groups:\n")
	for i, e := range exprs {
		fmt.Fprintf(&b, "  - name: %q\n    rules:\n      - record: dashboard:query_%d\n        expr: %q\n", e.Where, i, e.Expr)
	}
	bin := promtool(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard-rules.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, bin, "check", "rules", "dashboard-rules.yaml")
}

// The dashboard shows what operators look at: throughput, batch latency,
// lag and time lag per partition, retries, dead letters, skips by layer,
// conflicts, readiness, pool saturation, what waits to be published, and
// the dedup retention's state.
func TestDashboardShowsEachSignal(t *testing.T) {
	exprs, err := deploy.DashboardExprs()
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range deploy.MetricNames(e.Expr) {
			used[n] = true
		}
	}
	for _, want := range []string{
		"onceflow_records_consumed_total", "onceflow_events_applied_total", "onceflow_batch_duration_seconds_bucket",
		"onceflow_partition_lag", "onceflow_partition_time_lag_seconds", "onceflow_transaction_retries_total",
		"onceflow_partition_retrying", "onceflow_dead_letters_total", "onceflow_dead_letters_published_total",
		"onceflow_duplicates_skipped_total", "onceflow_duplicates_conflicting_total", "onceflow_batches_fenced_total",
		"onceflow_ready",
		"onceflow_postgres_pool_acquired_connections", "onceflow_postgres_pool_max_connections",
		"onceflow_postgres_pool_empty_acquire_wait_seconds_total", "onceflow_outbox_oldest_pending_age_seconds",
		"onceflow_dead_letters_oldest_unpublished_age_seconds", "onceflow_dedup_rotation_overdue_seconds",
		"onceflow_dedup_drop_overdue_seconds", "onceflow_dedup_drop_held", "onceflow_dedup_slices",
	} {
		if !used[want] {
			t.Errorf("no dashboard panel reads %s", want)
		}
	}
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		name, expr string
		want       []string
	}{
		{"one", `onceflow_ready == 0`, []string{"onceflow_ready"}},
		{"labels and functions", `sum by (topic, partition) (rate(onceflow_partition_committed_offset{job=~"x"}[5m]))`,
			[]string{"onceflow_partition_committed_offset"}},
		{"two, a histogram's series", `sum(rate(onceflow_batch_records_sum[1m])) / sum(rate(onceflow_batch_records_count[1m])) > go_goroutines`,
			[]string{"go_goroutines", "onceflow_batch_records_count", "onceflow_batch_records_sum"}},
		{"not inside a string", `process_resident_memory_bytes{job="onceflow_demo"}`, []string{"process_resident_memory_bytes"}},
		{"repeated once", `onceflow_ready and onceflow_ready offset 10m`, []string{"onceflow_ready"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := deploy.MetricNames(tc.expr); !slices.Equal(got, tc.want) {
				t.Errorf("MetricNames(%q) = %v, want %v", tc.expr, got, tc.want)
			}
		})
	}
}

// Every link into docs/operating.md, in the rule file (its comments too)
// and in the dashboard, names a section that exists.
func TestLinksIntoTheDocsResolve(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[anchor(m[1])] = true
	}
	link := regexp.MustCompile(`operating\.md#([a-z0-9_-]+)`)
	for _, f := range []string{"prometheus/onceflow-rules.yaml", "prometheus/onceflow-rules.test.yaml", "grafana/onceflow.json"} {
		b, err := os.ReadFile(filepath.FromSlash(f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			if !anchors[m[1]] {
				t.Errorf("%s links to docs/operating.md#%s: no such section", f, m[1])
			}
		}
	}
}

// The conflicting-duplicate alert and its section quote the dead-letter
// reason onceflow writes, so an operator's query for it finds the rows.
func TestConflictAlertQuotesTheRealReason(t *testing.T) {
	rules, err := deploy.Rules()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(rules, func(r deploy.Rule) bool { return r.Alert == "OnceflowConflictingDuplicate" })
	if i < 0 {
		t.Fatal("no OnceflowConflictingDuplicate alert")
	}
	if d := rules[i].Annotations["description"]; !strings.Contains(d, `"`+sink.ReasonConflict+`"`) {
		t.Errorf("OnceflowConflictingDuplicate's description does not quote the reason %q:\n%s", sink.ReasonConflict, d)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	sec := string(doc)[strings.Index(string(doc), "#### OnceflowConflictingDuplicate"):]
	sec = sec[:strings.Index(sec[1:], "####")+1]
	if !strings.Contains(strings.Join(strings.Fields(sec), " "), "`"+sink.ReasonConflict+"`") {
		t.Errorf("docs/operating.md#onceflowconflictingduplicate does not quote the reason %q:\n%s", sink.ReasonConflict, sec)
	}
}

// A dashboard panel that draws a ratio (a rate of one counter over a rate
// of another) beside other series gives the ratio a unit of its own and
// the other axis, by an override on its query: a share of 0–1 on the axis
// of per-second rates or of a count reads as zero.
func TestDashboardRatiosHaveTheirOwnAxis(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("grafana", "onceflow.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title       string `json:"title"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
				Overrides []struct {
					Matcher struct {
						ID      string `json:"id"`
						Options any    `json:"options"`
					} `json:"matcher"`
					Properties []struct {
						ID    string `json:"id"`
						Value any    `json:"value"`
					} `json:"properties"`
				} `json:"overrides"`
			} `json:"fieldConfig"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	ratio := regexp.MustCompile(`^sum\(rate\(\w+_total\{[^}]*\}\[[^]]*\]\)\)\s*/\s*sum\(rate\(\w+_total\{[^}]*\}\[[^]]*\]\)\)$`)
	for _, p := range d.Panels {
		var ratios, others []string
		for _, tg := range p.Targets {
			if ratio.MatchString(strings.TrimSpace(tg.Expr)) {
				ratios = append(ratios, tg.RefID)
			} else {
				others = append(others, tg.RefID)
			}
		}
		if len(ratios) == 0 || len(others) == 0 {
			continue
		}
		for _, ref := range ratios {
			props := map[string]any{}
			for _, o := range p.FieldConfig.Overrides {
				if o.Matcher.ID == "byFrameRefID" && o.Matcher.Options == ref {
					for _, pr := range o.Properties {
						props[pr.ID] = pr.Value
					}
				}
			}
			if props["unit"] != "percentunit" || props["custom.axisPlacement"] != "right" {
				t.Errorf("panel %q: query %s is a ratio drawn beside %v (unit %q) without an override giving it unit percentunit on the right axis (has %v)",
					p.Title, ref, others, p.FieldConfig.Defaults.Unit, props)
			}
		}
	}
}
