package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestSystemAccountsClosed: a client learns the regions' transit accounts
// as any client would, from cross-region transfers' steps, and then tries
// to pay into and out of them (the ledger's plan tests cover the issuance
// accounts as well). The API refuses each request in the account's region
// (422 system_account, the same for a hold) before it records anything,
// and the ledger refuses a transfer into another region's transit account
// at its credit, which returns the money. No balance moves but the
// completed transfers'.
func TestSystemAccountsClosed(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	a, a2 := e.account(t, "eu", keyA, 100), e.account(t, "eu", keyA, 0)
	b := e.account(t, "us", keyA, 0)
	// Each region's transit account is the hold leg of a transfer out of it.
	euTransit := e.transitOf(t, "eu", "out-of-eu", a, b, 10)
	usTransit := e.transitOf(t, "us", "out-of-us", b, a, 1)

	refused := []struct{ name, region, body string }{
		{"IntoTransit", "eu", transferJSON(a, euTransit, 1)},
		{"OutOfTransit", "eu", transferJSON(euTransit, a, 1)},
		{"HoldIntoTransit", "eu", holdJSON(a, euTransit, 1, "")},
		{"OutOfTransitAskedElsewhere", "ap", transferJSON(euTransit, a, 1)},
		{"IntoTransitAskedElsewhere", "us", transferJSON(a, euTransit, 1)},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, tc.region, "POST", "/v1/transfers", keyA, "sys-"+tc.name, tc.body)
			wantProblem(t, tc.name, r, http.StatusUnprocessableEntity, ledger.CodeSystemAccount)
			// Refused by the API, before any key or transfer is
			// recorded: the key is still free for another request.
			r = e.do(t, tc.region, "POST", "/v1/transfers", keyA, "sys-"+tc.name, transferJSON(a, a2, 1))
			if r.status != http.StatusCreated {
				t.Errorf("the refused request's key, used again for a transfer between A's accounts: %d %s, want 201", r.status, r.body)
			}
		})
	}

	// Into another region's transit account: the API of eu cannot see us's
	// accounts, so us's ledger refuses the credit and the money returns.
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "sys-remote", transferJSON(a, usTransit, 5))
	var remote api.TransferBody
	r.json(t, &remote)
	if remote.ID == "" {
		t.Fatalf("transfer into us's transit account: %d %s", r.status, r.body)
	}
	e.quiet(t)
	if got := e.transfer(t, "eu", keyA, remote.ID); got.Status == string(ledger.StatusCompleted) || got.Reason != ledger.CodeSystemAccount {
		t.Errorf("transfer into us's transit account: %s (%s), want refused with system_account", got.Status, got.Reason)
	}
	if got, want := e.balance(t, "eu", keyA, a), int64(91-len(refused)); got != want {
		t.Errorf("A's eu balance: got %d, want %d (only the completed transfers moved money)", got, want)
	}
	if got := e.balance(t, "us", keyA, b); got != 9 {
		t.Errorf("A's us balance: got %d, want 9", got)
	}
}

// transitOf completes a cross-region transfer out of region and returns
// the account of its hold leg: the region's transit account.
func (e *env) transitOf(tb testing.TB, region, key, from, to string, amount int64) string {
	tb.Helper()
	r := e.do(tb, region, "POST", "/v1/transfers", keyA, key, transferJSON(from, to, amount))
	var tr api.TransferBody
	r.json(tb, &tr)
	e.quiet(tb)
	tr = e.transfer(tb, region, keyA, tr.ID)
	if tr.Status != string(ledger.StatusCompleted) {
		tb.Fatalf("cross-region transfer out of %s: %s, want COMPLETED", region, tr.Status)
	}
	for _, s := range tr.Steps {
		if s.Leg == string(ledger.LegHold) {
			return s.Account
		}
	}
	tb.Fatalf("the steps of a transfer out of %s name no transit account: %+v", region, tr.Steps)
	return ""
}
