package demo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/demo"
	"github.com/paymesh/paymesh/internal/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
)

func TestDemoWithoutFaultsCountsExactly(t *testing.T) {
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmtest_demo_nf_%d_", os.Getpid()),
		Accounts: 5, Transfers: 400, Seed: 9, HTTPShare: 0.2, ClientRetry: 0.1, ProducerRetry: 0.1, DropAck: 0.3,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	rep.Print(&out)
	if !rep.OK() || rep.Missed() != 0 {
		t.Fatalf("demo without faults: injected minus caught %d:\n%s", rep.Missed(), out.String())
	}
}

func TestDemoPasses(t *testing.T) {
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmtest_demo_%d_", os.Getpid()),
		Accounts: 5, Transfers: 600, Seed: 7, HTTPShare: 0.2,
		ClientRetry: 0.1, ProducerRetry: 0.1, DropAck: 0.3, Poison: 0.02, Faults: demo.FaultNames,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	rep.Print(&out)
	if !rep.OK() {
		t.Fatalf("demo failed:\n%s", out.String())
	}
	for _, l := range []dedup.Layer{dedup.LayerMsgID, dedup.LayerIdempotencyKey} {
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
	for _, want := range []string{"PASS  [global] eu: balance equals the sum of its change-log", "PASS  [global] per currency, transit balances equal the money in transit"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	// Each region's three /metrics, for a Prometheus to scrape.
	metrics := regexp.MustCompile(`(?m)^  (eu|us|ap): /metrics ledger http://127\.0\.0\.1:\d+/metrics router http://127\.0\.0\.1:\d+/metrics api http://127\.0\.0\.1:\d+/metrics$`)
	if got := metrics.FindAllString(out.String(), -1); len(got) != 3 {
		t.Errorf("got %d lines of /metrics URLs, want one per region:\n%s", len(got), out.String())
	}
}

// TestDemoThrowawayPostgres: with no server at the URL, the demo runs on a
// throwaway cluster from the local binaries, and the cluster is gone
// afterwards. The JSON report says where the databases lived.
func TestDemoThrowawayPostgres(t *testing.T) {
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2",
		Accounts:    3, Transfers: 100, Seed: 3,
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
		Accounts: 5, Transfers: 100, Seed: 5, Rate: 50, WAN: true,
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
