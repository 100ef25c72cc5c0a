package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// holdJSON is a hold request; expires is sent as given (empty: none).
func holdJSON(from, to string, amount int64, expires string) string {
	if expires != "" {
		return fmt.Sprintf(`{"from":%q,"to":%q,"amount":%d,"currency":"EUR","hold":true,"expires_at":%q}`, from, to, amount, expires)
	}
	return fmt.Sprintf(`{"from":%q,"to":%q,"amount":%d,"currency":"EUR","hold":true}`, from, to, amount)
}

func (e *env) transfer(tb testing.TB, region, apiKey, id string) api.TransferBody {
	tb.Helper()
	r := e.do(tb, region, "GET", "/v1/transfers/"+id, apiKey, "", "")
	if r.status != http.StatusOK {
		tb.Fatalf("get transfer %s: %d %s", id, r.status, r.body)
	}
	var t api.TransferBody
	r.json(tb, &t)
	return t
}

// wantProblem fails unless r is the problem status/code.
func wantProblem(tb testing.TB, what string, r response, status int, code ledger.Code) {
	tb.Helper()
	if r.status != status || r.code(tb) != code {
		tb.Fatalf("%s: got %d %s, want %d %s", what, r.status, r.body, status, code)
	}
}

// TestHoldsOverHTTP authorizes, captures (in part), voids and expires holds
// and refunds transfers through the API of three regions: any region
// answers, the right one decides, repeats replay the first answer, losers
// and strangers get their stable codes, and bad input is refused.
func TestHoldsOverHTTP(t *testing.T) {
	e := mustEnv(t, time.Hour)
	a := e.account(t, "eu", keyA, 1000)
	a2 := e.account(t, "eu", keyA, 0)
	b := e.account(t, "us", keyB, 0)

	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "h1", holdJSON(a, a2, 300, ""))
	if r.status != http.StatusCreated {
		t.Fatalf("hold: %d %s", r.status, r.body)
	}
	var h api.TransferBody
	r.json(t, &h)
	if h.Status != string(ledger.StatusHeld) || h.ExpiresAt == nil || h.ExpiresAt.Sub(time.Now()) < 6*24*time.Hour {
		t.Fatalf("hold: status %s expires %v, want HELD in about 7 days", h.Status, h.ExpiresAt)
	}
	if acc := e.accountBody(t, "eu", keyA, a); acc.Balance != 1000 || acc.Held != 300 || acc.Available != 700 {
		t.Fatalf("account after hold: %+v, want balance 1000 held 300 available 700", acc)
	}
	capture := "/v1/transfers/" + h.ID + "/capture"

	t.Run("BadInput", func(t *testing.T) {
		wantProblem(t, "no key", e.do(t, "eu", "POST", capture, keyA, "", `{"amount":10}`), http.StatusBadRequest, api.CodeIdempotencyKeyMissing)
		wantProblem(t, "negative", e.do(t, "eu", "POST", capture, keyA, "bad1", `{"amount":-1}`), http.StatusUnprocessableEntity, ledger.CodeInvalidAmount)
		wantProblem(t, "fraction", e.do(t, "eu", "POST", capture, keyA, "bad2", `{"amount":1.5}`), http.StatusUnprocessableEntity, ledger.CodeInvalidAmount)
		wantProblem(t, "unknown field", e.do(t, "eu", "POST", capture, keyA, "bad3", `{"amont":1}`), http.StatusBadRequest, ledger.CodeInvalidRequest)
		wantProblem(t, "void with an amount", e.do(t, "eu", "POST", "/v1/transfers/"+h.ID+"/void", keyA, "bad4", `{"amount":1}`), http.StatusBadRequest, ledger.CodeInvalidRequest)
		wantProblem(t, "not JSON", e.do(t, "eu", "POST", capture, keyA, "bad5", `amount=1`), http.StatusBadRequest, ledger.CodeInvalidRequest)
		wantProblem(t, "no such transfer", e.do(t, "eu", "POST", "/v1/transfers/nope/capture", keyA, "bad6", ``), http.StatusNotFound, ledger.CodeNotFound)
		wantProblem(t, "capture over the hold", e.do(t, "us", "POST", capture, keyA, "bad7", `{"amount":301}`), http.StatusUnprocessableEntity, ledger.CodeAmountExceedsHold)
		past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
		far := time.Now().Add(31 * 24 * time.Hour).UTC().Format(time.RFC3339)
		wantProblem(t, "expiry in the past", e.do(t, "eu", "POST", "/v1/transfers", keyA, "bad8", holdJSON(a, a2, 1, past)), http.StatusBadRequest, ledger.CodeInvalidRequest)
		wantProblem(t, "expiry past 30 days", e.do(t, "eu", "POST", "/v1/transfers", keyA, "bad9", holdJSON(a, a2, 1, far)), http.StatusBadRequest, ledger.CodeInvalidRequest)
		wantProblem(t, "expiry without hold", e.do(t, "eu", "POST", "/v1/transfers", keyA, "bad10",
			fmt.Sprintf(`{"from":%q,"to":%q,"amount":1,"currency":"EUR","expires_at":%q}`, a, a2, far)), http.StatusBadRequest, ledger.CodeInvalidRequest)
		wantProblem(t, "hold past the available", e.do(t, "eu", "POST", "/v1/transfers", keyA, "bad11", holdJSON(a, a2, 701, "")),
			http.StatusUnprocessableEntity, ledger.CodeInsufficientFunds)
	})

	t.Run("StrangersGet404", func(t *testing.T) {
		wantProblem(t, "another client's capture", e.do(t, "eu", "POST", capture, keyB, "s1", ``), http.StatusNotFound, ledger.CodeNotFound)
		wantProblem(t, "another client's void", e.do(t, "ap", "POST", "/v1/transfers/"+h.ID+"/void", keyB, "s2", ``), http.StatusNotFound, ledger.CodeNotFound)
	})

	t.Run("CaptureInPartFromAnotherRegion", func(t *testing.T) {
		r := e.do(t, "us", "POST", capture, keyA, "c1", `{"amount":100}`)
		if r.status != http.StatusOK {
			t.Fatalf("capture: %d %s", r.status, r.body)
		}
		var got api.TransferBody
		r.json(t, &got)
		if got.Status != string(ledger.StatusCompleted) || got.CapturedAmount == nil || *got.CapturedAmount != 100 {
			t.Fatalf("capture: %s", r.body)
		}
		again := e.do(t, "ap", "POST", capture, keyA, "c1", `{"amount":100}`)
		if again.status != http.StatusOK || string(again.body) != string(r.body) || again.header.Get(api.HeaderReplayed) != "true" {
			t.Fatalf("repeat: %d %s (replayed %q), want the first answer replayed", again.status, again.body, again.header.Get(api.HeaderReplayed))
		}
		wantProblem(t, "same key, other amount", e.do(t, "eu", "POST", capture, keyA, "c1", `{"amount":99}`), http.StatusUnprocessableEntity, ledger.CodeIdempotencyKeyReused)
		wantProblem(t, "void after capture", e.do(t, "eu", "POST", "/v1/transfers/"+h.ID+"/void", keyA, "v1", ``), http.StatusConflict, ledger.CodeTransferNotHeld)
		wantProblem(t, "second capture", e.do(t, "eu", "POST", capture, keyA, "c2", ``), http.StatusConflict, ledger.CodeTransferNotHeld)
		if acc := e.accountBody(t, "eu", keyA, a); acc.Balance != 900 || acc.Held != 0 || acc.Available != 900 {
			t.Fatalf("account after capture: %+v, want 900 held 0", acc)
		}
	})

	t.Run("Void", func(t *testing.T) {
		r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "h2", holdJSON(a, b, 200, ""))
		var v api.TransferBody
		r.json(t, &v)
		r = e.do(t, "us", "POST", "/v1/transfers/"+v.ID+"/void", keyA, "v2", ``)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":"VOIDED"`) {
			t.Fatalf("void: %d %s", r.status, r.body)
		}
		wantProblem(t, "capture after void", e.do(t, "eu", "POST", "/v1/transfers/"+v.ID+"/capture", keyA, "c3", ``), http.StatusConflict, ledger.CodeTransferNotHeld)
		if acc := e.accountBody(t, "eu", keyA, a); acc.Held != 0 {
			t.Fatalf("held after void: %d", acc.Held)
		}
	})

	t.Run("Expiry", func(t *testing.T) {
		soon := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
		r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "h3", holdJSON(a, a2, 50, soon))
		var x api.TransferBody
		r.json(t, &x)
		deadline := time.Now().Add(20 * time.Second)
		for e.transfer(t, "eu", keyA, x.ID).Status != string(ledger.StatusExpired) {
			if time.Now().After(deadline) {
				t.Fatalf("hold %s did not expire: %+v", x.ID, e.transfer(t, "eu", keyA, x.ID))
			}
			time.Sleep(100 * time.Millisecond)
		}
		wantProblem(t, "capture after expiry", e.do(t, "eu", "POST", "/v1/transfers/"+x.ID+"/capture", keyA, "c4", ``), http.StatusConflict, ledger.CodeTransferNotHeld)
		// The hold's retry, past the expiry it asked for, gets its first answer.
		again := e.do(t, "us", "POST", "/v1/transfers", keyA, "h3", holdJSON(a, a2, 50, soon))
		if again.status != r.status || string(again.body) != string(r.body) || again.header.Get(api.HeaderReplayed) != "true" {
			t.Fatalf("hold retried after its expiry: %d %s, want the first answer %d %s replayed", again.status, again.body, r.status, r.body)
		}
		if acc := e.accountBody(t, "eu", keyA, a); acc.Held != 0 || acc.Balance != 900 {
			t.Fatalf("account after expiry: %+v", acc)
		}
	})

	t.Run("CaptureAcrossRegionsThenRefunds", func(t *testing.T) {
		r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "h4", holdJSON(a, b, 400, ""))
		var x api.TransferBody
		r.json(t, &x)
		r = e.do(t, "ap", "POST", "/v1/transfers/"+x.ID+"/capture", keyA, "c5", `{"amount":250}`)
		if r.status != http.StatusOK && r.status != http.StatusAccepted {
			t.Fatalf("capture across regions: %d %s", r.status, r.body)
		}
		e.quiet(t)
		if got := e.transfer(t, "eu", keyA, x.ID); got.Status != string(ledger.StatusCompleted) || *got.CapturedAmount != 250 {
			t.Fatalf("after the saga: %+v", got)
		}
		if got := e.balance(t, "us", keyB, b); got != 250 {
			t.Fatalf("payee: %d, want 250", got)
		}
		refunds := "/v1/transfers/" + x.ID + "/refunds"
		wantProblem(t, "the payer's refund", e.do(t, "eu", "POST", refunds, keyA, "r0", `{"amount":10}`), http.StatusNotFound, ledger.CodeNotFound)
		wantProblem(t, "refund without a key", e.do(t, "eu", "POST", refunds, keyB, "", `{"amount":10}`), http.StatusBadRequest, api.CodeIdempotencyKeyMissing)
		r = e.do(t, "ap", "POST", refunds, keyB, "r1", `{"amount":100}`)
		if r.status != http.StatusCreated && r.status != http.StatusAccepted {
			t.Fatalf("refund: %d %s", r.status, r.body)
		}
		var rf api.TransferBody
		r.json(t, &rf)
		if rf.RefundOf != x.ID || rf.From != b || rf.To != a || rf.Amount != 100 {
			t.Fatalf("refund: %s", r.body)
		}
		again := e.do(t, "eu", "POST", refunds, keyB, "r1", `{"amount":100}`)
		if bodyID(t, again) != rf.ID {
			t.Fatalf("refund repeated: %d %s, want the first refund %s", again.status, again.body, rf.ID)
		}
		wantProblem(t, "refund past the captured amount", e.do(t, "us", "POST", refunds, keyB, "r2", `{"amount":151}`),
			http.StatusUnprocessableEntity, ledger.CodeRefundExceedsCaptured)
		r = e.do(t, "us", "POST", refunds, keyB, "r3", ``)
		var rest api.TransferBody
		r.json(t, &rest)
		if rest.Amount != 150 {
			t.Fatalf("refund of the rest: %d %s", r.status, r.body)
		}
		wantProblem(t, "refund of nothing left", e.do(t, "us", "POST", refunds, keyB, "r4", ``), http.StatusUnprocessableEntity, ledger.CodeRefundExceedsCaptured)
		e.quiet(t)
		got := e.transfer(t, "eu", keyA, x.ID)
		if got.RefundedAmount == nil || *got.RefundedAmount != 250 || len(got.Refunds) != 2 {
			t.Fatalf("transfer after its refunds: %+v", got)
		}
		if got := e.balance(t, "eu", keyA, a); got != 900 {
			t.Fatalf("payer after the refunds: %d, want 900", got)
		}
	})
	e.quiet(t)
	for _, st := range e.c.Stores() {
		if rep, err := st.Verify(t.Context()); err != nil || !rep.OK() {
			t.Fatalf("verify: %v\n%v", err, rep)
		}
	}
	if rep, err := postgres.VerifyGlobal(t.Context(), e.c.Stores(), true); err != nil || !rep.OK() {
		t.Fatalf("verify: %v\n%v", err, rep)
	}
}

func bodyID(tb testing.TB, r response) string {
	tb.Helper()
	var t api.TransferBody
	r.json(tb, &t)
	return t.ID
}

// TestActionAnsweredByItsDecision: a capture is answered only with what its
// ledger decided. While its transaction waits (a lock on the source
// account), the API's wait runs out and it answers 409 in flight, storing
// nothing; the hold expires meanwhile, the capture is refused, and a retry
// gets that refusal, not a 200 naming the hold as it stood.
func TestActionAnsweredByItsDecision(t *testing.T) {
	e := mustEnv(t, time.Hour)
	a, b := e.account(t, "eu", keyA, 1000), e.account(t, "eu", keyA, 0)
	soon := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339Nano)
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "held", holdJSON(a, b, 100, soon))
	var h api.TransferBody
	r.json(t, &h)
	g := &rowGate{t: t, pool: e.c.Region("eu").Ledger.Store.Pool(), account: a}
	g.close()
	t.Cleanup(g.release)
	capture := "/v1/transfers/" + h.ID + "/capture"
	wantProblem(t, "capture while its transaction waits", e.do(t, "eu", "POST", capture, keyA, "late", ``), http.StatusConflict, api.CodeIdempotencyKeyInFlight)
	g.release()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := e.do(t, "eu", "POST", capture, keyA, "late", ``)
		if r.status != http.StatusConflict || r.code(t) != api.CodeIdempotencyKeyInFlight {
			if code := r.code(t); r.status != http.StatusConflict || (code != ledger.CodeHoldExpired && code != ledger.CodeTransferNotHeld) {
				t.Fatalf("capture after the expiry: %d %s, want 409 hold_expired or transfer_not_held", r.status, r.body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the capture was never decided")
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.quiet(t)
	if got := e.transfer(t, "eu", keyA, h.ID); got.Status != string(ledger.StatusExpired) {
		t.Fatalf("hold: %s, want EXPIRED", got.Status)
	}
}

// TestActionRepeatedAfterItsKey: a capture refused, repeated once its key
// expired and was deleted, gets the same refusal from the capture's record
// (the ledger's business key of actions); one that applied gets the hold it
// captured.
func TestActionRepeatedAfterItsKey(t *testing.T) {
	for _, submitAll := range []bool{false, true} {
		// Submitted, a repeat within the ledger stream's Msg-Id window is
		// answered by the API from the action's record (submittedBefore).
		t.Run(map[bool]string{false: "applied-here", true: "submitted"}[submitAll], func(t *testing.T) {
			actionRepeatedAfterItsKey(t, submitAll)
		})
	}
}

func actionRepeatedAfterItsKey(t *testing.T, submitAll bool) {
	e := mustEnv(t, time.Second, func(c *cluster.Config) {
		c.API = func(_ string, ac *apid.Config) { ac.SubmitAll = submitAll }
	})
	a, b := e.account(t, "eu", keyA, 1000), e.account(t, "eu", keyA, 0)
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "held", holdJSON(a, b, 300, ""))
	var h api.TransferBody
	r.json(t, &h)
	capture := "/v1/transfers/" + h.ID + "/capture"
	wantProblem(t, "capture over the hold", e.do(t, "eu", "POST", capture, keyA, "too-much", `{"amount":301}`), http.StatusUnprocessableEntity, ledger.CodeAmountExceedsHold)
	first := e.do(t, "eu", "POST", capture, keyA, "all", ``)
	if first.status != http.StatusOK {
		t.Fatalf("capture: %d %s", first.status, first.body)
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := e.c.Region("eu").APIStore.DeleteExpiredKeys(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, "the refused capture again", e.do(t, "us", "POST", capture, keyA, "too-much", `{"amount":301}`), http.StatusUnprocessableEntity, ledger.CodeAmountExceedsHold)
	again := e.do(t, "ap", "POST", capture, keyA, "all", ``)
	var got api.TransferBody
	again.json(t, &got)
	if again.status != http.StatusOK || got.Status != string(ledger.StatusCompleted) || got.CapturedAmount == nil || *got.CapturedAmount != 300 {
		t.Fatalf("the capture again: %d %s, want 200 with the captured hold", again.status, again.body)
	}
	if acc := e.accountBody(t, "eu", keyA, a); acc.Balance != 700 || acc.Held != 0 {
		t.Fatalf("source: %+v, want 700 held 0 (captured once)", acc)
	}
}

// TestHoldExpiresAcrossACrash: the region's ledger, router and API crash
// right after a hold is made and come back after its expiry passed: the
// expiry step, written with the hold, is sent and applied when they are
// back, once; a capture then is refused.
func TestHoldExpiresAcrossACrash(t *testing.T) {
	e := mustEnv(t, time.Hour)
	a, b := e.account(t, "eu", keyA, 1000), e.account(t, "eu", keyA, 0)
	soon := time.Now().Add(300 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "brief", holdJSON(a, b, 100, soon))
	var h api.TransferBody
	r.json(t, &h)
	if h.Status != string(ledger.StatusHeld) {
		t.Fatalf("hold: %d %s", r.status, r.body)
	}
	if err := e.c.RestartRegion(t.Context(), "eu"); err != nil {
		t.Fatal(err)
	}
	e.quiet(t)
	// Read the hold in its region's database: the restarted API's
	// subscriptions may not have reached the other regions yet.
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := e.c.Region("eu").Ledger.Store.Transfer(t.Context(), h.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == ledger.StatusExpired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hold did not expire after the crash: %s", got.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantProblem(t, "capture after the expiry", e.do(t, "eu", "POST", "/v1/transfers/"+h.ID+"/capture", keyA, "c", ``), http.StatusConflict, ledger.CodeTransferNotHeld)
	if acc := e.accountBody(t, "eu", keyA, a); acc.Held != 0 || acc.Balance != 1000 {
		t.Fatalf("source: %+v", acc)
	}
}
