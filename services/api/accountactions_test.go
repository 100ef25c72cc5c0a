package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestAccountActionsOverHTTP freezes, unfreezes and closes an eu account
// through the API of every region: the home region decides, a retry
// anywhere replays the first answer, another request under the key is
// 422, a refusal names its reason, a stranger gets 404 and bad input 400;
// a credit from us to the closed account is refunded to its sender.
func TestAccountActionsOverHTTP(t *testing.T) {
	for _, submitAll := range []bool{false, true} {
		// Applied by the API's own group commit, or submitted to the
		// ledger stream: the same answers.
		t.Run(map[bool]string{false: "applied-here", true: "submitted"}[submitAll], func(t *testing.T) {
			accountActionsOverHTTP(t, submitAll)
		})
	}
}

func accountActionsOverHTTP(t *testing.T, submitAll bool) {
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.API = func(_ string, ac *apid.Config) { ac.SubmitAll = submitAll }
	})
	a, b := e.account(t, "eu", keyA, 100), e.account(t, "eu", keyA, 0)
	payer, far := e.account(t, "eu", keyA, 20), e.account(t, "us", keyA, 100)
	path := func(op string) string { return "/v1/accounts/" + a + "/" + op }
	body := func(r response) api.AccountBody {
		t.Helper()
		var got api.AccountBody
		r.json(t, &got)
		return got
	}

	first := e.act(t, "us", path("freeze"), "freeze-1", "")
	if got := body(first); first.status != http.StatusOK || !got.Frozen || got.ID != a || got.Balance != 100 {
		t.Fatalf("freeze via us: %d %s, want 200 and the account frozen", first.status, first.body)
	}
	again := e.act(t, "eu", path("freeze"), "freeze-1", "{}")
	if again.status != first.status || string(again.body) != string(first.body) || again.header.Get(api.HeaderReplayed) != "true" {
		t.Fatalf("the freeze again via eu: %d %s (replayed %q), want the first answer replayed", again.status, again.body, again.header.Get(api.HeaderReplayed))
	}
	wantProblem(t, "an unfreeze under the freeze's key", e.act(t, "ap", path("unfreeze"), "freeze-1", ""),
		http.StatusUnprocessableEntity, ledger.CodeIdempotencyKeyReused)
	wantProblem(t, "a debit of the frozen account", e.do(t, "eu", "POST", "/v1/transfers", keyA, "t-frozen", transferJSON(a, b, 10)),
		http.StatusUnprocessableEntity, ledger.CodeAccountFrozen)
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "t-in", transferJSON(payer, a, 20)); r.status != http.StatusCreated {
		t.Fatalf("a credit of the frozen account: %d %s, want 201 (credits still land)", r.status, r.body)
	}
	wantProblem(t, "a second freeze", e.act(t, "eu", path("freeze"), "freeze-2", ""), http.StatusUnprocessableEntity, ledger.CodeAccountFrozen)
	if r := e.act(t, "ap", path("unfreeze"), "unfreeze-1", ""); r.status != http.StatusOK || body(r).Frozen {
		t.Fatalf("unfreeze via ap: %d %s", r.status, r.body)
	}
	wantProblem(t, "an unfreeze of an account not frozen", e.act(t, "eu", path("unfreeze"), "unfreeze-2", ""),
		http.StatusConflict, ledger.CodeAccountNotFrozen)

	// Close: refused while the account holds money, the refusal replayed.
	notEmpty := e.act(t, "us", path("close"), "close-1", "")
	wantProblem(t, "a close with money", notEmpty, http.StatusConflict, ledger.CodeAccountNotEmpty)
	if r := e.act(t, "eu", path("close"), "close-1", ""); r.status != notEmpty.status || string(r.body) != string(notEmpty.body) {
		t.Fatalf("the refused close again: %d %s, want %d %s", r.status, r.body, notEmpty.status, notEmpty.body)
	}
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "drain", transferJSON(a, b, 120)); r.status != http.StatusCreated {
		t.Fatalf("drain: %d %s", r.status, r.body)
	}
	closed := e.act(t, "ap", path("close"), "close-2", "")
	if got := body(closed); closed.status != http.StatusOK || !got.Closed || got.Balance != 0 {
		t.Fatalf("close: %d %s, want 200 and the account closed", closed.status, closed.body)
	}
	wantProblem(t, "a second close", e.act(t, "eu", path("close"), "close-3", ""), http.StatusUnprocessableEntity, ledger.CodeAccountClosed)
	wantProblem(t, "a transfer into the closed account", e.do(t, "eu", "POST", "/v1/transfers", keyA, "t-closed", transferJSON(b, a, 10)),
		http.StatusUnprocessableEntity, ledger.CodeAccountClosed)

	// From another region: the credit is refused in eu, the sender refunded.
	r := e.do(t, "us", "POST", "/v1/transfers", keyA, "t-far", transferJSON(far, a, 40))
	if r.status != http.StatusCreated && r.status != http.StatusAccepted {
		t.Fatalf("cross-region transfer to the closed account: %d %s", r.status, r.body)
	}
	id := bodyID(t, r)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		x := e.transfer(t, "us", keyA, id)
		if x.Status == string(ledger.StatusRefunded) {
			if x.Reason != ledger.CodeAccountClosed {
				t.Fatalf("refunded for %s, want account_closed", x.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the transfer to the closed account is %s, not refunded", x.Status)
		}
	}
	if got := e.balance(t, "us", keyA, far); got != 100 {
		t.Fatalf("sender after the refund: %d, want 100", got)
	}

	// Bad input and strangers.
	wantProblem(t, "no key", e.do(t, "eu", "POST", "/v1/accounts/"+b+"/freeze", keyA, "", ""), http.StatusBadRequest, api.CodeIdempotencyKeyMissing)
	wantProblem(t, "a body with a field", e.do(t, "eu", "POST", "/v1/accounts/"+b+"/freeze", keyA, "bad-1", `{"reason":"x"}`),
		http.StatusBadRequest, ledger.CodeInvalidRequest)
	wantProblem(t, "a body that is not JSON", e.do(t, "us", "POST", "/v1/accounts/"+b+"/close", keyA, "bad-2", `close`),
		http.StatusBadRequest, ledger.CodeInvalidRequest)
	wantProblem(t, "another client's account", e.do(t, "us", "POST", "/v1/accounts/"+b+"/freeze", keyB, "bad-3", ""),
		http.StatusNotFound, ledger.CodeAccountNotFound)
	wantProblem(t, "an account that does not exist", e.do(t, "us", "POST", "/v1/accounts/"+e.id(t, "eu")+"/freeze", keyA, "bad-4", ""),
		http.StatusNotFound, ledger.CodeAccountNotFound)
	wantProblem(t, "not an account id", e.do(t, "us", "POST", "/v1/accounts/nope/close", keyA, "bad-5", ""),
		http.StatusNotFound, ledger.CodeAccountNotFound)
	if got := e.accountBody(t, "eu", keyA, b); got.Frozen || got.Closed {
		t.Fatalf("after the refused requests: %+v, want b open", got)
	}
}

// act sends an account action of client A as a client that follows
// Retry-After: while the API answers that its key is in flight (its wait
// ran out before the home ledger decided, as on a loaded machine), the
// same request again, for a minute at most.
func (e *env) act(tb testing.TB, region, path, key, body string) response {
	tb.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		r := e.do(tb, region, "POST", path, keyA, key, body)
		if r.status != http.StatusConflict || !strings.Contains(string(r.body), string(api.CodeIdempotencyKeyInFlight)) || time.Now().After(deadline) {
			return r
		}
	}
}

// TestAccountActionRepeatedAfterItsKey: once a freeze's key has expired, a
// repeat within the ledger stream's Msg-Id window is answered from the
// freeze's record and the account as it is now, and a repeat of a refused
// unfreeze gets its refusal; neither applies again.
func TestAccountActionRepeatedAfterItsKey(t *testing.T) {
	e := mustEnv(t, time.Second, func(c *cluster.Config) {
		c.API = func(_ string, ac *apid.Config) { ac.SubmitAll = true }
	})
	a := e.account(t, "eu", keyA, 10)
	path := "/v1/accounts/" + a + "/"
	if r := e.do(t, "eu", "POST", path+"freeze", keyA, "freeze", ""); r.status != http.StatusOK {
		t.Fatalf("freeze: %d %s", r.status, r.body)
	}
	wantProblem(t, "a second freeze", e.do(t, "eu", "POST", path+"freeze", keyA, "freeze-again", ""), http.StatusUnprocessableEntity, ledger.CodeAccountFrozen)
	time.Sleep(1500 * time.Millisecond)
	if _, err := e.c.Region("eu").APIStore.DeleteExpiredKeys(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	again := e.do(t, "us", "POST", path+"freeze", keyA, "freeze", "")
	var got api.AccountBody
	again.json(t, &got)
	if again.status != http.StatusOK || !got.Frozen || got.ID != a {
		t.Fatalf("the freeze again after its key: %d %s, want 200 with the frozen account", again.status, again.body)
	}
	wantProblem(t, "the refused freeze again", e.do(t, "ap", "POST", path+"freeze", keyA, "freeze-again", ""), http.StatusUnprocessableEntity, ledger.CodeAccountFrozen)
	wantProblem(t, "an unfreeze under the freeze's key", e.do(t, "eu", "POST", path+"unfreeze", keyA, "freeze", ""),
		http.StatusUnprocessableEntity, ledger.CodeIdempotencyKeyReused)
	var records int
	if err := e.c.Region("eu").Ledger.Store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM account_actions WHERE account_id = $1`, a).Scan(&records); err != nil || records != 2 {
		t.Fatalf("%d records of the account's actions (%v), want 2: the freeze and the refused one", records, err)
	}
}
