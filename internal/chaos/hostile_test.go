package chaos

import (
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// TestCheckerCatchesBOLA: scenario 11 with the API's owner check on the
// source account skipped. The workload client's transfers from the second
// client's accounts are then accepted and applied: "refused" names them as
// BOLA requests answered 2xx, and I3 names the transfers they made although
// every hostile request was recorded as refused.
func TestCheckerCatchesBOLA(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault-injection run")
	}
	r := runOne(t, Config{bugs: ledger.Bugs{SkipOwnerCheck: true}, QuietWait: 10 * time.Second}, "11")
	requireFailure(t, r, "refused", "BOLA transfer from the other client's account")
	requireFailure(t, r, I3, "answers only refused requests (hostile")
}
