// Package deploy holds what operators load beside onceflow, and reads it
// for the tests that keep it true: the Prometheus alert rules
// (prometheus/onceflow-rules.yaml, unit-tested by
// prometheus/onceflow-rules.test.yaml) and the Grafana dashboard
// (grafana/onceflow.json). Rules and DashboardExprs return their
// PromQL expressions, MetricNames the series an expression reads, so a
// test against a running member can check that each exists on /metrics.
package deploy

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

//go:embed prometheus/onceflow-rules.yaml
var rules []byte

//go:embed grafana/onceflow.json
var dashboard []byte

// Expr is one PromQL expression and where it is: "alert X" for a rule,
// `panel "T" query A` for a dashboard target.
type Expr struct {
	Where string
	Expr  string
}

// Rules returns every rule of prometheus/onceflow-rules.yaml, in file
// order.
func Rules() ([]Rule, error) {
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []Rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(rules, &f); err != nil {
		return nil, fmt.Errorf("prometheus/onceflow-rules.yaml: %w", err)
	}
	var out []Rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// Rule is one alerting rule as the file states it.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// grafanaVars are the dashboard's variables and what DashboardExprs puts
// in their place: values PromQL accepts, so each expression can be parsed
// as Prometheus would receive it from Grafana.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "1m",
	"$__range", "1h",
	"${job}", ".*",
	"$job", ".*",
)

// DashboardExprs returns the expression of every query of every panel of
// grafana/onceflow.json, with Grafana's variables replaced by values (the
// job matches every job, intervals are minutes). An expression with a
// variable it does not know is an error naming it.
func DashboardExprs() ([]Expr, error) {
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("grafana/onceflow.json: %w", err)
	}
	var out []Expr
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			where := fmt.Sprintf("panel %q query %s", p.Title, t.RefID)
			e := grafanaVars.Replace(t.Expr)
			if strings.TrimSpace(e) == "" {
				return nil, fmt.Errorf("grafana/onceflow.json: %s has no expression", where)
			}
			if i := strings.Index(e, "$"); i >= 0 {
				return nil, fmt.Errorf("grafana/onceflow.json: %s uses an unknown variable at %q", where, e[i:])
			}
			out = append(out, Expr{Where: where, Expr: e})
		}
	}
	return out, nil
}

var (
	quoted = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	// Metric names onceflow exports: its own and the Go and process
	// collectors'. Label names never start so.
	metricName = regexp.MustCompile(`(?:^|[^a-zA-Z0-9_:])((?:onceflow|go|process)_[a-zA-Z0-9_:]*)`)
)

// MetricNames returns the metric names expr reads, sorted and once each:
// the identifiers outside string literals that start with onceflow_, go_ or
// process_ (the families a member exports). A histogram's series keep
// their suffix (_bucket, _sum, _count).
func MetricNames(expr string) []string {
	expr = quoted.ReplaceAllString(expr, `""`)
	var out []string
	for _, m := range metricName.FindAllStringSubmatch(expr, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}
