package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/lab/hookaudit"
	"github.com/paymesh/paymesh/services/dupexplain"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/receiver"
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
		Hooks: &HooksAudit{Audit: hookaudit.Audit{Events: 10, Delivered: 10, Attempts: 13, Applied: 10, Effects: 10,
			Duplicates: map[receiver.Cause]int64{receiver.CauseRedelivery: 2, receiver.CauseRetry: 1}}, Redelivered: 2},
		LeaderKills: []LeaderKill{{Stream: "LEDGER_EU", Killed: "nats-eu-2", LeaderWhileDown: "nats-eu-3"}},
		Failover: &Failover{Region: "eu", Killed: "postgres-eu-1", Promoted: "postgres-eu-2", KilledAt: t0, Writable: 6 * time.Second,
			LastOld: t0.Add(-10 * time.Millisecond), FirstNew: t0.Add(6 * time.Second), Gap: 6010 * time.Millisecond, Rejoined: 9 * time.Second,
			Requests: 40, Retried: 12, MaxTries: 4},
		Explained: &Explained{Traced: true,
			Regions: map[string]dupexplain.Report{"us": {Region: "us", Duplicates: 12, Causes: []dupexplain.Cause{
				{Cause: "republish", Count: 9, AgeP50: 0.2, AgeP99: 1.5, AgeP999: 1.9, Layers: map[string]float64{"msg_id": 9}},
				{Cause: "redelivery", Count: 3, AgeP50: 2, AgeP99: 9, AgeP999: 9.9, Layers: map[string]float64{"dedup_table": 3}}}}},
			Windows: map[string]map[string]float64{"us": {"dedup_table": 6 * 86400, "msg_id": 120}},
			Degraded: &dupexplain.Report{Region: "us", Duplicates: 10, Causes: []dupexplain.Cause{{Cause: "republish", Count: 8, AgeP99: 1.5}},
				Traces: []dupexplain.Trace{{ID: "4bf92f3577b34da6a3ce929d0e0e4736", Cause: "republish", Layer: "msg_id", Service: "router"}}},
			InJaeger: &TraceFound{ID: "4bf92f3577b34da6a3ce929d0e0e4736", Spans: 7, Services: []string{"paymesh-ledger-us", "paymesh-router-us"}}},
		Transport: Transport{
			NATS: []NATSTransport{
				{Server: "nats-hub", ClientTLS: true, Leafnodes: true, LeafTLS: true},
				{Server: "nats-eu-1", ClientTLS: true, Routes: true, RouteTLS: true, Conns: 4, TLSVersions: map[string]int{"1.3": 4}},
			},
			Postgres: []PostgresTransport{{Region: "eu", Conns: 12, Rules: []string{"local peer", "hostssl scram-sha-256"}, SCRAM: true}},
		},
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
		{"UnfinishedRouterLog", func(r *Report) {
			r.Unfinished, r.RouterLogs = 1, []string{"router-ap's log ends: relay: steps not acked"}
		}, "router-ap's log ends"},
		{"ServiceExited", func(r *Report) { r.Failed = []string{"router-ap exited (exit status 1): no NATS"} }, "router-ap exited"},
		{"VerifyFailed", func(r *Report) { r.Verify.Checks[0].OK = false }, "global invariants"},
		{"ToolFailed", func(r *Report) { r.Tools["verify-eu"] = false }, "verify-eu"},
		{"AlertBeforeDegrade", func(r *Report) { r.Alerts[0].FiredAt = r.DegradedFrom.Add(-time.Second) }, "fired for us"},
		{"AlertOtherRegion", func(r *Report) { r.Alerts[0].Labels["region"] = "eu" }, "fired for us"},
		{"AlertStillFiring", func(r *Report) { r.Alerts[0].Cleared = false }, "cleared"},
		{"EmptyPanel", func(r *Report) { r.PanelsEmpty = []string{`panel "Lag": no data`} }, `panel "Lag"`},
		{"NothingAcknowledged", func(r *Report) { r.Acknowledged = 0 }, "acknowledged"},
		{"HookLost", func(r *Report) {
			r.Hooks.Lost, r.Hooks.Unapplied = 1, []string{"LOST eu-x.3 (transfer.completed): delivered, never applied"}
		}, "LOST eu-x.3"},
		{"HookDoubled", func(r *Report) { r.Hooks.Doubled, r.Hooks.Mismatch = 1, []string{"order eu-t: 2 effects, 1 event"} }, "order eu-t"},
		{"HookRedeliveryUnseen", func(r *Report) { r.Hooks.Redelivered = 4 }, "4 redelivered, 3 duplicates"},
		{"HookNothingApplied", func(r *Report) { r.Hooks.Applied = 0 }, "reference receiver"},
		{"LoadFailed", func(r *Report) { r.LoadError = "exit status 1" }, "exit status 1"},
		{"LeaderNotMoved", func(r *Report) {
			r.LeaderKills = []LeaderKill{{Stream: "LEDGER_EU", Killed: "nats-eu-2", LeaderWhileDown: "nats-eu-2"}}
		}, "LEDGER_EU kept a leader while its leader nats-eu-2 was down"},
		{"NATSClientsPlain", func(r *Report) { r.Transport.NATS[1].ClientTLS = false }, "nats-eu-1: does not require TLS of its clients"},
		{"NATSRoutesPlain", func(r *Report) { r.Transport.NATS[1].RouteTLS = false }, "nats-eu-1: cluster routes without TLS"},
		{"NATSLeafPlain", func(r *Report) { r.Transport.NATS[0].LeafTLS = false }, "nats-hub: accepts leafnodes without TLS"},
		{"NATSPlainConn", func(r *Report) { r.Transport.NATS[1].Plain = []string{"ledger-eu (user ledger-eu, 127.0.0.1:5)"} }, "ledger-eu (user ledger-eu"},
		{"NATSNoConn", func(r *Report) { r.Transport.NATS[1].Conns = 0 }, "no nats-server client connection"},
		{"PostgresPlainConn", func(r *Report) { r.Transport.Postgres[0].Plain = []string{"api-eu (127.0.0.1:6)"} }, "postgres eu: a connection without TLS: api-eu"},
		{"PostgresLooseRule", func(r *Report) { r.Transport.Postgres[0].Loose = []string{"host trust"} }, "hba rule host trust"},
		{"PostgresNoSCRAM", func(r *Report) { r.Transport.Postgres[0].SCRAM = false }, "no scram-sha-256 verifier"},
		{"PostgresNone", func(r *Report) { r.Transport.Postgres = nil }, "no Postgres network connection"},
		{"TransportUnread", func(r *Report) { r.TransportError = "sim: transport: nats-eu-1: refused" }, "nats-eu-1: refused"},
		{"DegradedUnexplained", func(r *Report) { r.Explained.Degraded.Causes = nil }, "us had none since its link was degraded"},
		{"DegradedUntraced", func(r *Report) {
			r.Explained.Degraded.Traces, r.Explained.Degraded.TraceSource = nil, "none: Prometheus kept no exemplar"
		}, "none: Prometheus kept no exemplar"},
		{"TraceNotInJaeger", func(r *Report) {
			r.Explained.InJaeger, r.Explained.JaegerError = nil, "jaeger: trace 4bf92f3577b34da6a3ce929d0e0e4736: 404 Not Found"
		}, "404 Not Found"},
		{"DuplicatesUnread", func(r *Report) { r.Explained.Error = "sim: prometheus: refused" }, "sim: prometheus: refused"},
		{"NoFailover", func(r *Report) {
			r.Failover.Promoted, r.Failover.Errors = "", []string{"failover: no other node took writes within 3m0s"}
		},
			"no other node took writes"},
		{"FailoverToTheKilled", func(r *Report) { r.Failover.Promoted = "postgres-eu-1" }, "postgres-eu-1 killed, postgres-eu-1 took writes"},
		{"NoRejoin", func(r *Report) {
			r.Failover.Rejoined, r.Failover.Errors = 0, []string{"rejoin: sim: eu's database not healthy after 3m0s: eu-1 catchingup→secondary"}
		}, "eu-1 catchingup→secondary"},
		{"NoCommitAfterFailover", func(r *Report) {
			r.Failover.Gap, r.Failover.Errors = 0, []string{"commit times: no write before the kill, or none after it"}
		}, "none after it"},
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

// TestPrintExplained: the report names each region's causes with their
// ages against the windows, the degraded link's dominant cause and its
// trace.
func TestPrintExplained(t *testing.T) {
	r := passing()
	r.judge()
	var b strings.Builder
	r.Print(&b)
	for _, want := range []string{"why duplicates came, by region and cause", "us: 12 duplicates; windows dedup_table 144h0m0s, msg_id 2m0s",
		"republish          9      200ms /      1.5s /      1.9s  msg_id 9", "us since its link was degraded: 10 duplicates, 80 % of them republish",
		"trace 4bf92f3577b34da6a3ce929d0e0e4736: a republish duplicate caught by msg_id in router",
		"in Jaeger: trace 4bf92f3577b34da6a3ce929d0e0e4736, 7 spans from paymesh-ledger-us, paymesh-router-us",
		"PASS  Jaeger holds the trace of a duplicate on the degraded link (4bf92f3577b34da6a3ce929d0e0e4736: 7 spans from paymesh-ledger-us, paymesh-router-us)",
		"PASS  why the degraded link's duplicates came: 10 duplicates, 80 % of them republish (age p99 1.5s); trace 4bf92f3577b34da6a3ce929d0e0e4736"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
}

// TestPrintPairs: the report gives each pair's cross-region p50 against
// its link's round trip, or says the links had no latency.
func TestPrintPairs(t *testing.T) {
	r := passing()
	r.Pairs = []PairLatency{{From: "eu", To: "us", Transfers: 40, P50Ms: 320, RTT: 80 * time.Millisecond},
		{From: "us", To: "ap", Transfers: 7, P50Ms: 95}}
	r.judge()
	var b strings.Builder
	r.Print(&b)
	for _, want := range []string{"cross-region p50 by pair, against the link's round trip", "eu→us 320 ms = 4.0 × 80ms (40)",
		"us→ap 95 ms (7, no link latency)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
}
