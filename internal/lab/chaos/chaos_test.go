package chaos

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgha/pghatest"
	"github.com/paymesh/paymesh/internal/testbed/pgserver"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
)

// shortRun is each scenario's workload in the test suite.
const shortRun = 1500 * time.Millisecond

func runOne(t *testing.T, cfg Config, name string) Result {
	t.Helper()
	cfg.PostgresURL, cfg.Seeds, cfg.Scenarios = pgtest.AdminURL(), []uint64{1}, []string{name}
	if cfg.Duration == 0 {
		cfg.Duration = shortRun
	}
	if cfg.QuietWait == 0 {
		cfg.QuietWait = time.Minute
	}
	res, err := Run(context.Background(), cfg, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	Print(&b, res)
	t.Logf("\n%s", b.String())
	if len(res) != 1 {
		t.Fatalf("%d results, want 1", len(res))
	}
	if res[0].Error != "" {
		t.Fatal(res[0].Error)
	}
	return res[0]
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// knownBugs are the scenarios whose invariants a known, not yet fixed bug
// breaks now and then: TestScenarios reports their failures as a skip, so
// that a change unrelated to the bug can land, and make chaos still fails
// on them. An entry names the bug; it goes when the bug is fixed.
var knownBugs = map[string]string{
	"5-pg-reset": "under load, with Postgres backends terminated and COMMITs cut, a transfer the API applied in its " +
		"region can be credited without its debit, leave money in transit or be applied again by a replay " +
		"(I1, I3, I6; it fails at the commit before the restructuring too: docs/ARCHITECTURE.md, Known limits)",
}

// allScenarios runs every scenario in TestScenarios, not only make test's
// set (make test-long passes it; make chaos runs them all, with three seeds,
// through paymesh-lab chaos).
var allScenarios = flag.Bool("chaos.allscenarios", false, "run every scenario, not only make test's set")

// ciScenarios is make test's set of clean runs: one of each kind of fault
// the deliberate-bug cases marked ci do not already run (a partition, a
// stream leader killed in an R3 region, hostile inputs, a Postgres
// restart), beside the duplicates every run counts.
var ciScenarios = []string{"1-duplicates", "6-pg-restart", "8-partition", "11-hostile-inputs", "13-leader-kill"}

// TestScenarios runs built scenarios with one seed for a short workload:
// every invariant holds and every fault fired. It runs ciScenarios, or
// with -chaos.allscenarios every scenario.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault-injection scenarios take about a minute")
	}
	for _, name := range ciScenarios {
		if _, err := scenarioByName(name); err != nil {
			t.Fatalf("make test's set: %v", err)
		}
	}
	for _, name := range Scenarios() {
		if !*allScenarios && !slices.Contains(ciScenarios, name) {
			continue
		}
		t.Run(name, func(t *testing.T) {
			needs(t, name)
			r := runOne(t, Config{}, name)
			if r.Faults == 0 {
				t.Errorf("%s: the fault never fired (%s)", name, r.Counts)
			}
			var failed []string
			for _, c := range r.Checks {
				if !c.OK {
					failed = append(failed, fmt.Sprintf("%s %s failed: %v", name, c.Name, c.Failures))
				}
			}
			if why, known := knownBugs[name]; known && len(failed) > 0 {
				t.Skipf("KNOWN BUG, quarantined from the suite (make chaos still fails on it): %s\n%s", why, strings.Join(failed, "\n"))
			}
			for _, f := range failed {
				t.Error(f)
			}
			if r.OK == 0 {
				t.Errorf("%s: no operation succeeded", name)
			}
		})
	}
}

// needs skips scenario name where it cannot run: without the local
// Postgres binaries for its own cluster, or without pg_auto_failover for
// its own formation (unless PAYMESH_REQUIRE_PGHA says this machine has it).
func needs(t *testing.T, name string) {
	t.Helper()
	s, _ := scenarioByName(name)
	if s.ownPostgres {
		if err := pgserver.Available(); err != nil {
			t.Skipf("%s starts its own Postgres cluster: %v", name, err)
		}
	}
	if s.ownHA {
		pghatest.Require(t)
	}
}

// findFailure returns the first failure of check name that says one of
// wants, or an error saying what it saw instead.
func findFailure(r Result, name string, wants ...string) (string, error) {
	c := r.Check(name)
	if c.OK {
		return "", fmt.Errorf("%s passed", name)
	}
	for _, f := range c.Failures {
		for _, want := range wants {
			if strings.Contains(f, want) {
				return f, nil
			}
		}
	}
	return "", fmt.Errorf("%s failed, but no failure says %q: %v", name, wants, c.Failures)
}
