package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/internal/testbed/promcheck"
	"github.com/paymesh/paymesh/internal/testbed/promcheck/promchecktest"
)

// alertRules fire TestValueHigh as soon as the value is above 0, and hold
// TestValuePending pending for an hour on the same condition.
const alertRules = `groups:
  - name: test
    rules:
      - alert: TestValueHigh
        expr: paymesh_test_value > 0
        labels: {severity: warning}
        annotations: {summary: "value of {{ $labels.region }} is high"}
      - alert: TestValuePending
        expr: paymesh_test_value > 0
        for: 1h
`

// TestAlertsFromPrometheus runs a real Prometheus on a target whose value
// the test sets, and reads /api/alerts: the alert fires with its region
// and topic, then clears once the value drops and stays in the history as
// cleared; the alert that was only pending is dropped.
func TestAlertsFromPrometheus(t *testing.T) {
	promchecktest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var value atomic.Int64
	value.Store(1)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE paymesh_test_value gauge\npaymesh_test_value{region=\"us\",topic=\"transfer\"} %d\n", value.Load())
	}))
	defer target.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("rule_files: [rules.yml]\nscrape_configs:\n  - job_name: test\n    static_configs:\n      - targets: [target:1]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), []byte(alertRules), 0o644); err != nil {
		t.Fatal(err)
	}
	prom, err := promcheck.Start(ctx, promcheck.Options{ConfigFile: cfg, ScrapeInterval: time.Second, EvaluationInterval: time.Second,
		Map: func(string) string { return strings.TrimPrefix(target.URL, "http://") }})
	if err != nil {
		t.Fatal(err)
	}
	defer prom.Stop()
	h := dashboard.NewAlertHistory(prom, "Prometheus "+prom.URL())
	go h.Run(ctx, 200*time.Millisecond)
	srv := httptest.NewServer(dashboard.New(dashboard.Config{Source: &source{}, Alerts: h}).Handler())
	defer srv.Close()

	waitFor := func(what string, ok func(dashboard.Alerts) bool) dashboard.Alerts {
		t.Helper()
		var last dashboard.Alerts
		for ctx.Err() == nil {
			last = getAlerts(t, srv.URL)
			if ok(last) {
				return last
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("%s: last /api/alerts %+v", what, last)
		return last
	}
	named := func(list []dashboard.AlertState, name string) *dashboard.AlertState {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
		return nil
	}
	// Prometheus evaluates a group's rules one after the other, so a read
	// may see the first rule's alert before the second's: wait for both.
	got := waitFor("TestValueHigh fires and TestValuePending is pending", func(a dashboard.Alerts) bool {
		f := named(a.Active, "TestValueHigh")
		return f != nil && f.State == "firing" && named(a.Active, "TestValuePending") != nil
	})
	if !got.Enabled || got.Note != "Prometheus "+prom.URL() || got.Error != "" {
		t.Errorf("alerts: enabled %v note %q error %q, want enabled with the Prometheus URL", got.Enabled, got.Note, got.Error)
	}
	f := named(got.Active, "TestValueHigh")
	if f.Region != "us" || f.Topic != "transfer" || f.Since.IsZero() || f.FiredAt.IsZero() || f.Summary != "value of us is high" {
		t.Errorf("firing alert: %+v, want region us, topic transfer, since and fired_at set, the summary", *f)
	}
	if p := named(got.Active, "TestValuePending"); p == nil || p.State != "pending" || !p.FiredAt.IsZero() {
		t.Errorf("pending alert: %+v, want pending and not fired", p)
	}

	value.Store(0)
	got = waitFor("TestValueHigh clears", func(a dashboard.Alerts) bool { return len(a.Active) == 0 && len(a.Cleared) > 0 })
	if len(got.Cleared) != 1 {
		t.Fatalf("cleared: %+v, want only TestValueHigh (the pending one never fired)", got.Cleared)
	}
	c := got.Cleared[0]
	if c.Name != "TestValueHigh" || c.State != "cleared" || c.Region != "us" || c.Topic != "transfer" || !c.ClearedAt.After(c.FiredAt) {
		t.Errorf("cleared alert: %+v, want TestValueHigh of us/transfer, cleared after it fired", c)
	}
}

// TestAlertsOff: without a Prometheus, /api/alerts says so, with empty
// lists (not null) for the page.
func TestAlertsOff(t *testing.T) {
	for name, cfg := range map[string]dashboard.Config{
		"NoHistory": {Source: &source{}},
		"Off":       {Source: &source{}, Alerts: dashboard.AlertsOff("prometheus not installed; make prometheus")},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(dashboard.New(cfg).Handler())
			defer srv.Close()
			var raw map[string]any
			getJSON(t, srv.URL+"/api/alerts", &raw)
			active, aok := raw["active"].([]any)
			cleared, cok := raw["cleared"].([]any)
			if raw["enabled"] != false || raw["note"] == "" || !aok || !cok || len(active)+len(cleared) != 0 {
				t.Fatalf("GET /api/alerts: %v, want enabled false, a note, empty lists", raw)
			}
		})
	}
}

func getAlerts(t *testing.T, base string) dashboard.Alerts {
	t.Helper()
	res, err := http.Get(base + "/api/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var a dashboard.Alerts
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /api/alerts: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if err := json.NewDecoder(res.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a
}
