package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/pgdb"
	"github.com/paymesh/paymesh/internal/pgtest"
	"github.com/paymesh/paymesh/services/ledger"
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

// TestScenarios runs every built scenario with one seed for a short
// workload: every invariant holds and every fault fired.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault-injection scenarios take about a minute")
	}
	for _, name := range Scenarios() {
		t.Run(name, func(t *testing.T) {
			if s, _ := scenarioByName(name); s.ownPostgres {
				if err := pgdb.Available(); err != nil {
					t.Skipf("%s starts its own Postgres cluster: %v", name, err)
				}
			}
			r := runOne(t, Config{}, name)
			if r.Faults == 0 {
				t.Errorf("%s: the fault never fired (%s)", name, r.Counts)
			}
			for _, c := range r.Checks {
				if !c.OK {
					t.Errorf("%s %s failed: %v", name, c.Name, c.Failures)
				}
			}
			if r.OK == 0 {
				t.Errorf("%s: no operation succeeded", name)
			}
		})
	}
}

// requireFailure asserts that check name failed and that its failures name
// transfers or keys with want in them.
func requireFailure(t *testing.T, r Result, name, want string) {
	t.Helper()
	c := r.Check(name)
	if c.OK {
		t.Fatalf("%s passed with the deliberate bug on: the checker cannot see it", name)
	}
	for _, f := range c.Failures {
		if strings.Contains(f, want) {
			t.Logf("%s names: %s", name, f)
			return
		}
	}
	t.Fatalf("%s failed, but no failure says %q: %v", name, want, c.Failures)
}

// TestCheckerCatchesDoubles: scenario 4 (requests published again past
// the Nats-Msg-Id window, half under a new transfer ID) with the
// consume-log keyed by transfer ID, the business-key lookup skipped and the
// unique (client, idempotency key) constraint dropped. A request sent again
// under a new transfer ID then applies twice, and I3 fails naming the key
// and both transfers. (In scenario 1 the same bug stays invisible: the API's
// idempotency keys and the streams' Msg-Id window catch every resubmit
// before the ledger.)
func TestCheckerCatchesDoubles(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault-injection run")
	}
	r := runOne(t, Config{bugs: ledger.Bugs{DedupByTransferID: true}, dropBusinessKey: true, QuietWait: 20 * time.Second}, "4")
	requireFailure(t, r, I3, "DOUBLED")
	if r.Doubled == 0 {
		t.Errorf("no key counted as doubled")
	}
}

// TestCheckerCatchesForgery: scenario 12 forging its publishes as the
// router's user, which may publish to ledger subjects: the forged transfers
// land, I3 names them, and the refusals check fails.
func TestCheckerCatchesForgery(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault-injection run")
	}
	r := runOne(t, Config{forgeAs: "router", QuietWait: 10 * time.Second}, "12")
	requireFailure(t, r, I3, "forged")
	requireFailure(t, r, "refused", "refused")
}

// TestCheckerCatchesLoss: scenario 2 with the ledger acking each batch
// before its transaction commits. A worker killed before COMMIT then loses
// acknowledged transfers, and I3 fails naming their keys.
func TestCheckerCatchesLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault-injection run")
	}
	r := runOne(t, Config{bugs: ledger.Bugs{AckBeforeCommit: true}, QuietWait: 3 * time.Second}, "2")
	requireFailure(t, r, I3, "LOST")
	if r.Lost == 0 {
		t.Errorf("no key counted as lost")
	}
}
