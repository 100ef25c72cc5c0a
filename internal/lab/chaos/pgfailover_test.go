package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestCheckerCatchesAsyncStandby: scenario 22 with the standby out of the
// write quorum (asynchronous), so the primary answers COMMIT without it.
// The commits the ledgers were answered while the primary's WAL senders
// were stopped die with the primary: acknowledged to JetStream, they are
// in no database after the failover, and I3 fails naming the transfers
// (or I1 and I6, when a lost commit was a saga step). The same fault with
// the standby synchronous loses nothing (TestScenarios).
func TestCheckerCatchesAsyncStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault-injection run")
	}
	needs(t, "22")
	r := runOne(t, Config{asyncStandby: true, QuietWait: 10 * time.Second}, "22")
	for _, name := range []string{I3, I1, I6} {
		c := r.Check(name)
		for _, f := range c.Failures {
			if !c.OK && strings.Contains(f, "transfer") {
				t.Logf("%s names: %s", name, f)
				return
			}
		}
	}
	t.Fatalf("with the standby asynchronous, I1, I3 and I6 never failed naming a transfer: the checker cannot see the lost commits")
}
