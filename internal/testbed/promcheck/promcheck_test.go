package promcheck_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/paymesh/paymesh/internal/testbed/promcheck"
	"github.com/paymesh/paymesh/internal/testbed/promcheck/promchecktest"
)

// The repository's Prometheus and Grafana files.
const (
	configFile    = "../../../deploy/prometheus/prometheus.yml"
	rulesFile     = "../../../deploy/prometheus/alerts.yml"
	rulesTest     = "../../../deploy/prometheus/alerts_test.yml"
	budgetTest    = "../../../deploy/prometheus/alerts_budget_test.yml"
	dashboardFile = "../../../deploy/grafana/paymesh.json"
)

// TestAlertRules: the alert rules pass promtool's checks and their unit
// tests, and the compose config passes `promtool check config` as it is
// (promtool does not resolve the compose host names) and mapped to
// loopback.
func TestAlertRules(t *testing.T) {
	promchecktest.Require(t)
	ctx := context.Background()
	if err := promcheck.CheckRules(ctx, rulesFile); err != nil {
		t.Error(err)
	}
	if err := promcheck.TestRules(ctx, rulesTest, budgetTest); err != nil {
		t.Error(err)
	}
	if err := promcheck.CheckConfig(ctx, configFile); err != nil {
		t.Error(err)
	}
	mapped := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := promcheck.WriteConfig(promcheck.Options{ConfigFile: configFile, Map: func(string) string { return "127.0.0.1:9101" }}, mapped); err != nil {
		t.Fatal(err)
	}
	if err := promcheck.CheckConfig(ctx, mapped); err != nil {
		t.Error(err)
	}
}

// copyRules copies the alert rules and their tests (alerts_test.yml and
// alerts_budget_test.yml) into a directory, with the rules edited by edit,
// and returns the paths of the rules and of alerts_test.yml.
func copyRules(t *testing.T, edit func(string) string) (rules, tests string) {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	edited := edit(string(b))
	if edited == string(b) {
		t.Fatal("the edit changed nothing: alerts.yml changed; update the test")
	}
	rules, tests = filepath.Join(dir, "alerts.yml"), filepath.Join(dir, "alerts_test.yml")
	if err := os.WriteFile(rules, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(rulesTest); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tests, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(budgetTest); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(budgetTest)), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return rules, tests
}

// TestBrokenRulesFail: the checks catch broken rules. Without its
// absolute floor the duplicate-rate alert fires on a quiet region's single
// duplicate, without its bytes bound the stream fill alert misses a stream
// full by bytes, and a dead-letter fill alert that does not divide by the
// stream's bound never fires, and the unit tests say so; a rule that does
// not parse fails `promtool check rules`.
func TestBrokenRulesFail(t *testing.T) {
	promchecktest.Require(t)
	ctx := context.Background()
	_, tests := copyRules(t, func(s string) string {
		return strings.Replace(s, "          and paymesh:duplicates:rate30s > 0.1\n", "", 1)
	})
	err := promcheck.TestRules(ctx, tests)
	if err == nil || !strings.Contains(err.Error(), "PaymeshDuplicateRateHigh") {
		t.Errorf("duplicate alert without its floor: promtool test rules: got %v, want a failure naming PaymeshDuplicateRateHigh", err)
	}
	_, tests = copyRules(t, func(s string) string {
		return strings.Replace(s, `              or label_replace(paymesh_stream_bytes{stream=~"LEDGER_.*|ROUTE_.*"} / (paymesh_stream_max_bytes > 0), "bound", "bytes", "", "")
`, "", 1)
	})
	if err := promcheck.TestRules(ctx, tests); err == nil || !strings.Contains(err.Error(), "PaymeshStreamFilling") {
		t.Errorf("stream fill alert without its bytes bound: promtool test rules: got %v, want a failure naming PaymeshStreamFilling", err)
	}
	_, tests = copyRules(t, func(s string) string {
		return strings.Replace(s, `paymesh_stream_messages{stream=~"DLQ_.*"} / (paymesh_stream_max_messages > 0)`, `paymesh_stream_messages{stream=~"DLQ_.*"} / 1e9`, 1)
	})
	if err := promcheck.TestRules(ctx, tests); err == nil || !strings.Contains(err.Error(), "PaymeshDeadLetterStreamFilling") {
		t.Errorf("dead-letter fill alert against no bound: promtool test rules: got %v, want a failure naming PaymeshDeadLetterStreamFilling", err)
	}
	rules, _ := copyRules(t, func(s string) string {
		return strings.Replace(s, "max by (region) (paymesh_outbox_lag_seconds) > 30", "max by (region) (paymesh_outbox_lag_seconds) >> 30", 1)
	})
	if err := promcheck.CheckRules(ctx, rules); err == nil || !strings.Contains(err.Error(), "parse error") {
		t.Errorf("rule that does not parse: promtool check rules: got %v, want a parse error", err)
	}
}

// TestBrokenBudgetRulesFail: alerts_budget_test.yml catches broken
// duplicate budget and dedup window rules. Without its floor the page
// fires on a quiet region's single duplicate; with the 1h/5m page at burn
// 3 instead of 14.4 a slow rise pages; a window alert that leaves out the
// business keys' duplicates misses the late ones.
func TestBrokenBudgetRulesFail(t *testing.T) {
	promchecktest.Require(t)
	for _, tc := range []struct {
		name  string
		edit  *strings.Replacer
		alert string
	}{
		{"NoFloor", strings.NewReplacer("            and paymesh:duplicates:rate1h * 3600 >= 10\n", "",
			"            and paymesh:duplicates:rate6h * 21600 >= 10\n", ""), "PaymeshDuplicateBudgetBurnFast"},
		{"PageAtBurn3", strings.NewReplacer("paymesh:duplicate_ratio:rate1h / 0.01 > 14.4\n            and paymesh:duplicate_ratio:rate5m / 0.01 > 14.4",
			"paymesh:duplicate_ratio:rate1h / 0.01 > 3\n            and paymesh:duplicate_ratio:rate5m / 0.01 > 3"), "PaymeshDuplicateBudgetBurnFast"},
		{"WindowWithoutBusinessKeys", strings.NewReplacer(`layer=~"dedup_table|business_key"`, `layer="dedup_table"`), "PaymeshDedupWindowNear"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, _ := copyRules(t, tc.edit.Replace)
			err := promcheck.TestRules(context.Background(), filepath.Join(filepath.Dir(rules), filepath.Base(budgetTest)))
			if err == nil || !strings.Contains(err.Error(), tc.alert) {
				t.Errorf("promtool test rules: got %v, want a failure naming %s", err, tc.alert)
			}
		})
	}
}

// TestPanelQueries: every target of every panel, rows' panels included,
// with template and interval variables substituted; bad dashboards are
// errors.
func TestPanelQueries(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		got, err := promcheck.PanelQueries("testdata/dashboard.json")
		if err != nil {
			t.Fatal(err)
		}
		want := []promcheck.PanelQuery{
			{Panel: "one", Expr: `rate(a{region=~".*"}[1m])`, Exemplar: true},
			{Panel: "one", Expr: `b{region=~".*", topic=~".*", other="$unknown"}`},
			{Panel: "nested", Expr: `c{region=~".*"}`},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got %+v\nwant %+v", got, want)
		}
	})
	t.Run("Repository", func(t *testing.T) {
		got, err := promcheck.PanelQueries(dashboardFile)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) < 15 {
			t.Errorf("%d queries, want every target of the dashboard", len(got))
		}
		for _, q := range got {
			if strings.Contains(q.Expr, "$") {
				t.Errorf("panel %q: %s: a variable is left", q.Panel, q.Expr)
			}
		}
	})
	dir := t.TempDir()
	for name, body := range map[string]string{
		"NotJSON":   `{"panels": [`,
		"NoPanels":  `{"title": "x"}`,
		"EmptyExpr": `{"panels": [{"title": "p", "targets": [{"expr": " "}]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".json")
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := promcheck.PanelQueries(path); err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("got %v, want an error naming %s", err, path)
			}
		})
	}
	t.Run("Missing", func(t *testing.T) {
		if _, err := promcheck.PanelQueries(filepath.Join(dir, "none.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("got %v, want not exist", err)
		}
	})
}

// ageMetric is the series the duplicate-age panels read; their exemplars
// open a duplicate's trace.
const ageMetric = "paymesh_duplicate_age_seconds_bucket"

// TestMetricQueries: the queries that read a metric; a dashboard where
// none does (c is read, c_bucket is not) is an error.
func TestMetricQueries(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		got, err := promcheck.MetricQueries("testdata/dashboard.json", "a")
		if err != nil {
			t.Fatal(err)
		}
		if want := []promcheck.PanelQuery{{Panel: "one", Expr: `rate(a{region=~".*"}[1m])`, Exemplar: true}}; !reflect.DeepEqual(got, want) {
			t.Errorf("got %+v\nwant %+v", got, want)
		}
	})
	t.Run("Repository", func(t *testing.T) {
		got, err := promcheck.MetricQueries(dashboardFile, ageMetric)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) < 4 {
			t.Errorf("%d queries read %s, want the p50, p99, p99.9 and heatmap targets", len(got), ageMetric)
		}
	})
	t.Run("NoneReads", func(t *testing.T) {
		if _, err := promcheck.MetricQueries("testdata/dashboard.json", "c_bucket"); err == nil || !strings.Contains(err.Error(), "no panel query reads c_bucket") {
			t.Errorf("got %v, want an error: no panel query reads c_bucket", err)
		}
	})
}

// TestWriteConfig: the mapped copy scrapes the mapped targets, drops
// unmapped targets and the jobs left empty, overrides the intervals and
// reads the rule files from RulesDir; bad configs are errors.
func TestWriteConfig(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(dir, "out.yml")
	o := promcheck.Options{ConfigFile: configFile, RulesDir: "/rules", ScrapeInterval: time.Second, EvaluationInterval: 500 * time.Millisecond,
		Map: func(target string) string {
			if strings.HasPrefix(target, "ledger-") {
				return "127.0.0.1:1" + strings.TrimPrefix(target, "ledger-eu:")
			}
			return ""
		}}
	if err := promcheck.WriteConfig(o, dst); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Global        map[string]string `yaml:"global"`
		RuleFiles     []string          `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	b, _ := os.ReadFile(dst)
	if err := yaml.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Global["scrape_interval"] != "1000ms" || got.Global["evaluation_interval"] != "500ms" {
		t.Errorf("global: got %v, want scrape 1000ms, evaluation 500ms", got.Global)
	}
	if !reflect.DeepEqual(got.RuleFiles, []string{"/rules/alerts.yml"}) {
		t.Errorf("rule_files: got %v, want [/rules/alerts.yml]", got.RuleFiles)
	}
	if len(got.ScrapeConfigs) != 1 || got.ScrapeConfigs[0].JobName != "paymesh-ledger" || len(got.ScrapeConfigs[0].StaticConfigs) != 1 ||
		!reflect.DeepEqual(got.ScrapeConfigs[0].StaticConfigs[0].Targets, []string{"127.0.0.1:19101", "127.0.0.1:1ledger-us:9102", "127.0.0.1:1ledger-ap:9103"}) {
		t.Errorf("scrape_configs: got %+v, want the ledger job alone, mapped", got.ScrapeConfigs)
	}

	for name, body := range map[string]string{
		"NotYAML":       "global: [",
		"Empty":         "",
		"ScrapeNotList": "scrape_configs: {a: 1}",
		"RulesNotList":  "rule_files: alerts.yml",
		"TargetNotText": "scrape_configs: [{job_name: j, static_configs: [{targets: [[1]]}]}]",
	} {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(dir, name+".yml")
			if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			err := promcheck.WriteConfig(promcheck.Options{ConfigFile: src, Map: func(s string) string { return s }}, dst)
			if err == nil || !strings.Contains(err.Error(), src) {
				t.Errorf("got %v, want an error naming %s", err, src)
			}
		})
	}
	if err := promcheck.WriteConfig(promcheck.Options{}, dst); err == nil {
		t.Error("no config file: got no error")
	}
}

// TestStartFails: Prometheus that cannot start is an error quoting its
// log, and leaves nothing running.
func TestStartFails(t *testing.T) {
	promchecktest.Require(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("rule_files: [bad.yml]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yml"), []byte("groups: [{name: g, rules: [{alert: A, expr: 'up >> 1'}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := promcheck.Start(context.Background(), promcheck.Options{ConfigFile: cfg, Dir: filepath.Join(dir, "run"), ReadyTimeout: 20 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "bad.yml") {
		t.Errorf("got %v, want an error saying prometheus exited, quoting its log about bad.yml", err)
	}
	if _, err := promcheck.Start(context.Background(), promcheck.Options{}); err == nil {
		t.Error("no config file: got no error")
	}
}

// TestDeadLetterPanels: the dashboard's dead-letter panels, evaluated by
// promtool on series of four regions (testdata/dead_letter_panels_test.yml):
// a region's dead letters by reason and the age of the oldest; 0 with
// reason "none" for a region whose ledger is scraped and holds none, so a
// clean run still has data; nothing for a region whose census has no
// numbers.
func TestDeadLetterPanels(t *testing.T) {
	promchecktest.Require(t)
	qs, err := promcheck.PanelQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]string{}
	for _, q := range qs {
		switch {
		case strings.Contains(q.Expr, "max by (region, reason) (paymesh_dlq_depth"):
			rules["panel:depth"] = q.Expr
		case strings.Contains(q.Expr, "max by (region, reason) (paymesh_dlq_oldest_seconds"):
			rules["panel:oldest"] = q.Expr
		}
	}
	if len(rules) != 2 {
		t.Fatalf("dead-letter panel queries found: %v, want paymesh_dlq_depth and paymesh_dlq_oldest_seconds by region and reason", rules)
	}
	var group struct {
		Groups []map[string]any `yaml:"groups"`
	}
	var list []map[string]string
	for _, name := range []string{"panel:depth", "panel:oldest"} {
		list = append(list, map[string]string{"record": name, "expr": rules[name]})
	}
	group.Groups = []map[string]any{{"name": "panels", "rules": list}}
	b, err := yaml.Marshal(group)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	test, err := os.ReadFile("testdata/dead_letter_panels_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"panels.yml": b, "panels_test.yml": test} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := promcheck.TestRules(context.Background(), filepath.Join(dir, "panels_test.yml")); err != nil {
		t.Fatal(err)
	}
}
