package demo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/internal/lab/demo"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/promcheck"
	"github.com/paymesh/paymesh/internal/testbed/promcheck/promchecktest"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/receiver"
)

// TestDemoWithoutFaultsCountsExactly also runs with Prometheus on auto
// and no prometheus on PATH: the demo runs, and says that alerts are off
// and why, at the start and in the report.
func TestDemoWithoutFaultsCountsExactly(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmtest_demo_nf_%d_", os.Getpid()),
		Accounts: 5, Transfers: 400, Seed: 9, HTTPShare: 0.2, ClientRetry: 0.1, ProducerRetry: 0.1, DropAck: 0.3, HookLoss: 0.1,
		Prometheus: demo.PrometheusAuto, Holds: 12, Refunds: 6,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	started := out.String()
	rep.Print(&out)
	if !rep.OK() {
		t.Fatalf("demo without faults: injected minus caught %d, repeats nobody injected %d:\n%s", rep.Missed(), rep.Unprompted(), out.String())
	}
	// The webhooks: every event applied once, and every duplicate the
	// receiver got is a lost answer's retry or a redelivery asked for.
	if h := rep.Hooks; h.Events == 0 || h.Applied != h.Events || h.Effects != h.Applied || h.AnswersLost == 0 || h.Redelivered == 0 ||
		h.Duplicates[receiver.CauseRetry] == 0 || !h.Explained() {
		t.Errorf("webhooks: %+v, want every event applied once, and each duplicate a lost answer's retry or a redelivery:\n%s", h, out.String())
	}
	const off = "alerts: off (prometheus not installed; make prometheus)\n"
	if strings.Count(started, off) != 1 || !strings.Contains(strings.TrimPrefix(out.String(), started), off) || rep.Alerts.On {
		t.Errorf("want %q once at the start and in the report (alerts %+v):\n%s", off, rep.Alerts, out.String())
	}
}

// TestDemoPrometheusRejected: a bad Prometheus mode, Prometheus asked for
// but not installed, and a missing config are errors before anything
// starts.
func TestDemoPrometheusRejected(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "prometheus.yml")
	grafana := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(grafana, []byte("scrape_configs:\n  - job_name: grafana\n    static_configs:\n      - targets: [ledger-eu:9101, grafana-eu:3000, api-mars:9301]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cfg  demo.Config
		path string
		want string
	}{
		"UnknownMode":  {cfg: demo.Config{Prometheus: "maybe"}, want: `prometheus "maybe": want auto, on or off`},
		"NotInstalled": {cfg: demo.Config{Prometheus: demo.PrometheusOn}, path: t.TempDir(), want: "make prometheus installs it"},
		"NoConfig":     {cfg: demo.Config{Prometheus: demo.PrometheusOn, PrometheusConfig: missing}, want: "prometheus config: stat " + missing},
		// A target that is none of the demo's services, found once the
		// regions run.
		"UnknownTarget": {cfg: demo.Config{Prometheus: demo.PrometheusOn, PrometheusConfig: grafana, Accounts: 2,
			DatabasePrefix: fmt.Sprintf("pmtest_demo_prom_%d_", os.Getpid())},
			want: `scrape target "grafana-eu:3000": no service "grafana" (ledger, router or api)` + "\n" + `scrape target "api-mars:9301": no region "mars" in the demo`},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.path != "" {
				t.Setenv("PATH", tc.path)
			} else if tc.cfg.PrometheusConfig != "" {
				promchecktest.Require(t)
			}
			tc.cfg.PostgresURL = pgtest.AdminURL()
			_, err := demo.Run(context.Background(), tc.cfg, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// prometheusMode is PrometheusOn where the tests must run Prometheus
// (installed, or PAYMESH_REQUIRE_PROMETHEUS set), otherwise auto.
func prometheusMode() string {
	if promcheck.Installed() == nil || os.Getenv("PAYMESH_REQUIRE_PROMETHEUS") != "" {
		return demo.PrometheusOn
	}
	return demo.PrometheusAuto
}

func TestDemoPasses(t *testing.T) {
	var out strings.Builder
	page := &alertPoller{done: make(chan struct{})}
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmtest_demo_%d_", os.Getpid()),
		Accounts: 5, Transfers: 600, Seed: 7, HTTPShare: 0.2,
		ClientRetry: 0.1, ProducerRetry: 0.1, DropAck: 0.3, Poison: 0.02, Faults: demo.FaultNames,
		Prometheus: prometheusMode(), Dashboard: "127.0.0.1:0", OnDashboard: page.watch,
	}, &out)
	page.stop()
	if err != nil {
		t.Fatal(err)
	}
	rep.Print(&out)
	if !rep.OK() {
		t.Fatalf("demo failed:\n%s", out.String())
	}
	for _, l := range []ledger.Layer{ledger.LayerMsgID, ledger.LayerIdempotencyKey} {
		if rep.Caught[string(l)] == 0 {
			t.Errorf("no duplicates caught by %s: %v", l, rep.Caught)
		}
	}
	if len(rep.Faults) != len(demo.FaultNames) {
		t.Errorf("faults fired: %v, want %v", rep.Faults, demo.FaultNames)
	}
	if rep.Poison == 0 || rep.Redeliveries == 0 || rep.Completed == 0 {
		t.Errorf("injection or traffic did not happen: poison %d, redeliveries %d, completed %d", rep.Poison, rep.Redeliveries, rep.Completed)
	}
	// The holds and refunds phase ran each flow, with every answer the
	// documented one.
	if f := rep.Flows; f.Captured == 0 || f.CapturedInPart == 0 || f.Voided == 0 || f.Expired == 0 || f.LateRefused == 0 ||
		f.Refunded == 0 || f.Twice == 0 || f.PastTotal == 0 {
		t.Errorf("holds and refunds: %+v", f)
	}
	for _, want := range []string{"PASS  [global] eu: balance equals the sum of its change-log", "PASS  [global] per currency, transit balances equal the money in transit",
		"PASS  holds: ", "PASS  refunds: ", "PASS  [global] eu: no hold is both captured and voided or expired"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	// Each region's three /metrics, for a Prometheus to scrape.
	metrics := regexp.MustCompile(`(?m)^  (eu|us|ap): /metrics ledger http://127\.0\.0\.1:\d+/metrics router http://127\.0\.0\.1:\d+/metrics api http://127\.0\.0\.1:\d+/metrics$`)
	if got := metrics.FindAllString(out.String(), -1); len(got) != 3 {
		t.Errorf("got %d lines of /metrics URLs, want one per region:\n%s", len(got), out.String())
	}
	// With Prometheus, its URL follows them, and the poison messages make
	// the dead-letter alert fire (it has no hold, and clears only 5m
	// after the last one).
	if prometheusMode() == demo.PrometheusOn {
		prom := regexp.MustCompile(`(?m)^  Prometheus: http://127\.0\.0\.1:\d+ \(alert rules beside .*deploy/prometheus/prometheus\.yml`)
		if !prom.MatchString(out.String()) || !rep.Alerts.On {
			t.Errorf("no Prometheus URL printed, or alerts off (%+v):\n%s", rep.Alerts, out.String())
		}
		var dlq []string
		for _, a := range rep.Alerts.Fired {
			if a.Name == "PaymeshDeadLettersGrowing" && a.Topic == "dlq" && !a.FiredAt.IsZero() {
				dlq = append(dlq, a.Region)
			}
		}
		if len(dlq) == 0 || !strings.Contains(out.String(), "alerts fired (Prometheus http://") ||
			!regexp.MustCompile(`(?m)^  PaymeshDeadLettersGrowing +region (eu|us|ap) +topic dlq +fired \d\d:\d\d:\d\d, `).MatchString(out.String()) {
			t.Errorf("PaymeshDeadLettersGrowing did not fire, or the report does not list it (alerts %+v):\n%s", rep.Alerts, out.String())
		}
	}
	// The live page's /api/alerts, polled during the run, showed it too.
	if page.polls == 0 {
		t.Fatal("GET /api/alerts never answered during the run")
	}
	if on := prometheusMode() == demo.PrometheusOn; page.last.Enabled != on || page.last.Active == nil || page.last.Cleared == nil {
		t.Errorf("/api/alerts: %+v, want enabled %v and lists", page.last, on)
	} else if on && (page.firing == nil || page.firing.Region == "" || page.firing.Since.IsZero() || page.firing.FiredAt.IsZero()) {
		t.Errorf("/api/alerts never listed PaymeshDeadLettersGrowing firing with its region, since and fired_at (last %+v)", page.last)
	}
}

// alertPoller polls the live page's /api/alerts every 200 ms until stop,
// keeping the last answer and the first dead-letter alert seen firing.
type alertPoller struct {
	done   chan struct{}
	wg     sync.WaitGroup
	polls  int
	last   dashboard.Alerts
	firing *dashboard.AlertState
}

func (p *alertPoller) watch(url string) {
	p.wg.Go(func() {
		for {
			select {
			case <-p.done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			res, err := http.Get(url + "api/alerts")
			if err != nil {
				continue
			}
			var a dashboard.Alerts
			err = json.NewDecoder(res.Body).Decode(&a)
			res.Body.Close()
			if err != nil {
				continue
			}
			p.polls++
			p.last = a
			for _, s := range a.Active {
				if s.Name == "PaymeshDeadLettersGrowing" && s.State == "firing" && s.Topic == "dlq" && p.firing == nil {
					p.firing = &s
				}
			}
		}
	})
}

// stop ends the polling; the fields are safe to read afterwards.
func (p *alertPoller) stop() {
	close(p.done)
	p.wg.Wait()
}

// TestDemoThrowawayPostgres: with no server at the URL, the demo runs on a
// throwaway cluster from the local binaries, and the cluster is gone
// afterwards. The JSON report says where the databases lived, and that
// alerts were off.
func TestDemoThrowawayPostgres(t *testing.T) {
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2",
		Accounts:    3, Transfers: 100, Seed: 3, Holds: -1, Refunds: -1,
	}, &out)
	if err != nil {
		if strings.Contains(err.Error(), "install PostgreSQL") {
			t.Skipf("no local PostgreSQL binaries: %v", err)
		}
		t.Fatal(err)
	}
	rep.Print(&out)
	if !rep.OK() || !strings.HasPrefix(rep.Postgres, "throwaway cluster in ") {
		t.Fatalf("throwaway demo:\n%s", out.String())
	}
	dir := strings.TrimPrefix(rep.Postgres, "throwaway cluster in ")
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("throwaway cluster folder %s still exists (%v)", dir, err)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil || back["Commands"] != float64(rep.Commands) || back["Verify"] == nil {
		t.Fatalf("JSON report: %s (%v)", b, err)
	}
	// Prometheus was not asked for: the report says alerts were off.
	if alerts, _ := back["Alerts"].(map[string]any); alerts["On"] != false || alerts["Note"] != "Prometheus off" || alerts["Fired"] == nil {
		t.Fatalf("JSON report's alerts: %v, want off, with a note and an empty list", back["Alerts"])
	}
}

// TestDemoWAN: with the region table's latency on the links, a
// cross-region transfer takes at least the two round trips its saga needs
// (the debit's credit command out and its result back, each published and
// acked across the hub): at the median, at least twice the smallest round
// trip between two regions.
func TestDemoWAN(t *testing.T) {
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	fastest := time.Duration(0)
	for i, a := range tab.Regions {
		for _, b := range tab.Regions[i+1:] {
			if rtt := tab.RoundTrip(a.Name, b.Name); fastest == 0 || rtt < fastest {
				fastest = rtt
			}
		}
	}
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmtest_demo_wan_%d_", os.Getpid()),
		Accounts: 5, Transfers: 100, Seed: 5, Rate: 50, WAN: true, Holds: -1, Refunds: -1,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	rep.Print(&out)
	if !rep.OK() {
		t.Fatalf("demo with WAN latency failed:\n%s", out.String())
	}
	if want := float64(2*fastest) / float64(time.Millisecond); rep.CrossRegionP50 < want {
		t.Fatalf("cross-region p50 %.1f ms, want at least %.0f ms (two round trips of the fastest pair):\n%s", rep.CrossRegionP50, want, out.String())
	}
	if !strings.Contains(out.String(), "WAN latency on the links to the hub (one way): eu 37.5ms, us 2.5ms, ap 72.5ms") {
		t.Errorf("the demo does not say which latency it plays:\n%s", out.String())
	}
}

// TestDemoR3 runs the demo on a JetStream cluster of three servers per
// region, with the NATS restart and the cut among its faults, and reports
// the start times it measured.
func TestDemoR3(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no prometheus
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmtest_demo_r3_%d_", os.Getpid()),
		Accounts: 5, Transfers: 400, Seed: 3, HTTPShare: 0.2, ClientRetry: 0.1, ProducerRetry: 0.1,
		Nodes: 3, Faults: []string{"cut-us", "restart-ap-nats"}, Prometheus: demo.PrometheusOff, Holds: -1, Refunds: -1,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	rep.Print(&out)
	if !rep.OK() || rep.Nodes != 3 || len(rep.Faults) != 2 {
		t.Fatalf("R3 demo: ok %v, %d nodes, faults %v:\n%s", rep.OK(), rep.Nodes, rep.Faults, out.String())
	}
	if !strings.Contains(out.String(), "NATS: a JetStream cluster of 3 per region, streams R3; started in ") {
		t.Errorf("want the start line naming the cluster:\n%s", out.String())
	}
	t.Logf("R3: NATS started in %s, the regions' services in %s", rep.NATSStart, rep.RegionsStart)
}

// TestDuplicateCheckCountsUnpromptedRedeliveries: on a loaded machine a
// batch can outlast AckWait, and a forward its PubAck's wait, and their
// repeats are caught though nobody injected them. The check allows as many
// extra catches as there were such repeats, and no more; an injected
// duplicate left uncaught still fails.
func TestDuplicateCheckCountsUnpromptedRedeliveries(t *testing.T) {
	const check = "every injected duplicate was caught exactly once"
	for _, tc := range []struct {
		name         string
		injected     int64 // acks dropped
		caught       int64
		redeliveries int64
		repeats      int64 // forwards delivered again by the routers
		pass         bool
	}{
		{"exact", 3, 3, 3, 0, true},
		{"a slow batch redelivered", 0, 8, 8, 0, true},
		{"both", 3, 5, 5, 0, true},
		{"a catch no redelivery explains", 0, 8, 7, 0, false},
		{"an injected duplicate missed", 3, 2, 3, 0, false},
		{"late forwards sent again", 3, 7, 4, 3, true},
		{"a catch no repeat explains", 3, 8, 4, 3, false},
		{"an injected duplicate missed beside repeats", 3, 2, 3, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := demo.Report{
				Injected:     map[string]int64{"ledger redelivery (acks dropped)": tc.injected},
				Caught:       map[string]int64{"dedup_table": tc.caught},
				Redeliveries: tc.redeliveries,
				Repeats:      map[string]int64{"router forward delivered again (late answer)": tc.repeats},
			}
			var out strings.Builder
			rep.Print(&out)
			want := "PASS  " + check
			if !tc.pass {
				want = "FAIL  " + check
			}
			if !strings.Contains(out.String(), want) {
				t.Errorf("want %q:\n%s", want, out.String())
			}
		})
	}
}
