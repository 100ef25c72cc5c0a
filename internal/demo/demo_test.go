package demo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

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
