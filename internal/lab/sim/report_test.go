package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// passing is a report every check of which passes.
func passing() *Report {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	return &Report{
		Acknowledged: 10, Completed: 10, Scheduled: []string{FaultDegrade}, Fired: []string{FaultDegrade},
		Verify:    postgres.Report{Region: "global", Checks: []postgres.Check{{Name: "x", OK: true}}},
		Tools:     map[string]bool{"verify-eu": true},
		WantAlert: duplicateAlert, AlertRequired: true, DegradedFrom: t0, DegradedTo: t0.Add(20 * time.Second),
		Alerts: []AlertSeen{{Name: duplicateAlert, Labels: map[string]string{"region": "us", "topic": "relay"}, Fired: true,
			FiredAt: t0.Add(25 * time.Second), Cleared: true, ClearedAt: t0.Add(50 * time.Second)}},
		PanelsChecked: 3,
		LeaderKills:   []LeaderKill{{Stream: "LEDGER_EU", Killed: "nats-eu-2", LeaderWhileDown: "nats-eu-3"}},
	}
}

// TestJudge: each way a run can go wrong fails the report, naming what.
func TestJudge(t *testing.T) {
	r := passing()
	r.judge()
	if !r.OK() || !r.Pass {
		t.Fatalf("want PASS, got %+v", r.Checks)
	}
	for _, tt := range []struct {
		name  string
		spoil func(r *Report)
		want  string // in the failed check's name or detail
	}{
		{"LostKey", func(r *Report) { r.Lost = []string{"k1 (asked eu, answered 202)"} }, "k1 (asked eu"},
		{"DoubledKey", func(r *Report) { r.Doubled = []string{"k2 (2 times in eu)"} }, "k2 (2 times"},
		{"FaultNotFired", func(r *Report) { r.Fired = nil }, FaultDegrade},
		{"FaultError", func(r *Report) { r.FaultErrors = []string{"cut-eu: refused"} }, "cut-eu: refused"},
		{"Unfinished", func(r *Report) { r.Unfinished = 1 }, "1 unfinished"},
		{"VerifyFailed", func(r *Report) { r.Verify.Checks[0].OK = false }, "global invariants"},
		{"ToolFailed", func(r *Report) { r.Tools["verify-eu"] = false }, "verify-eu"},
		{"AlertBeforeDegrade", func(r *Report) { r.Alerts[0].FiredAt = r.DegradedFrom.Add(-time.Second) }, "fired for us"},
		{"AlertOtherRegion", func(r *Report) { r.Alerts[0].Labels["region"] = "eu" }, "fired for us"},
		{"AlertStillFiring", func(r *Report) { r.Alerts[0].Cleared = false }, "cleared"},
		{"EmptyPanel", func(r *Report) { r.PanelsEmpty = []string{`panel "Lag": no data`} }, `panel "Lag"`},
		{"NothingAcknowledged", func(r *Report) { r.Acknowledged = 0 }, "acknowledged"},
		{"LoadFailed", func(r *Report) { r.LoadError = "exit status 1" }, "exit status 1"},
		{"LeaderNotMoved", func(r *Report) {
			r.LeaderKills = []LeaderKill{{Stream: "LEDGER_EU", Killed: "nats-eu-2", LeaderWhileDown: "nats-eu-2"}}
		}, "LEDGER_EU kept a leader while its leader nats-eu-2 was down"},
		{"NoLeaderWhileDown", func(r *Report) {
			r.LeaderKills = []LeaderKill{{Stream: "LEDGER_EU", Killed: "nats-eu-2", LeaderWhileDown: "none (no leader)"}}
		}, "none (no leader)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := passing()
			tt.spoil(r)
			r.judge()
			if r.OK() {
				t.Fatalf("want FAIL, got PASS")
			}
			var b strings.Builder
			r.Print(&b)
			for _, c := range r.Checks {
				if !c.OK && strings.Contains(c.Name+"\n"+c.Detail, tt.want) {
					if !strings.Contains(b.String(), "FAIL  "+c.Name) {
						t.Fatalf("printed report lacks the failed check %q:\n%s", c.Name, b.String())
					}
					return
				}
			}
			t.Fatalf("no failed check names %q: %+v", tt.want, r.Checks)
		})
	}
}

// TestJudgeQuickAlert: a quick run that saw no alert for us still passes,
// and its report says the alert was not seen.
func TestJudgeQuickAlert(t *testing.T) {
	r := passing()
	r.AlertRequired = false
	r.Alerts = nil
	r.judge()
	if !r.OK() {
		t.Fatalf("want PASS, got %+v", r.Checks)
	}
	var b strings.Builder
	r.Print(&b)
	if !strings.Contains(b.String(), "fired for us once its link was degraded (topics ) (not seen; required of full runs only)") {
		t.Fatalf("the report does not say the alert was not seen:\n%s", b.String())
	}
}
