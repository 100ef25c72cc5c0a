package chaos

import (
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// TestCheckerCatchesForgottenKeyTransfer: scenario 10 with the store's
// TransferByKey finding nothing. A request sent again after the clock
// steps expired its key is then submitted under a new transfer ID; the
// route stream drops it by Nats-Msg-Id, so nothing applies twice, but the
// API answers 202 with a transfer ID that will never exist, and the
// same-transfer check names the key.
func TestCheckerCatchesForgottenKeyTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault-injection run")
	}
	r := runOne(t, Config{bugs: ledger.Bugs{ForgetKeyTransfer: true}, QuietWait: 20 * time.Second}, "10")
	requireFailure(t, r, "same-transfer", "after a step")
}
