package postgres_test

import (
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
)

// change builds a close, freeze or unfreeze of account by client c1, under
// its own key.
func change(tb testing.TB, f *ledgertest.Fixture, typ, account string) ledger.Command {
	tb.Helper()
	return ledger.Command{Type: typ, ClientID: "c1", IdempotencyKey: typ + "-" + f.ID(tb), From: account, CreatedAt: f.Clock.Now()}
}

// TestAccountActions runs freeze, unfreeze and close against the ledger:
// a frozen account refuses debits and takes credits; a close needs a zero
// balance and no open hold, and a closed account takes nothing and
// changes no more; each refusal names its reason and is recorded; a
// repeat is a duplicate answered with the first record and the account as
// it is now; another request under the key is a conflict; a command naming
// another client's account is dead-lettered, recording nothing.
func TestAccountActions(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 50)

	freeze := change(t, f, ledger.TypeFreeze, a)
	if r := f.MustApply(t, freeze); r.Account == nil || !r.Account.Frozen || r.Action.Status != ledger.ActionApplied {
		t.Fatalf("freeze: %+v, want the account frozen", r)
	}
	refused(t, "a debit of a frozen account", f.Apply(t, f.Transfer(t, a, b, 10))[0], ledger.CodeAccountFrozen)
	refused(t, "a hold on a frozen account", f.Apply(t, hold(t, f, a, b, 10, time.Hour))[0], ledger.CodeAccountFrozen)
	f.MustApply(t, f.Transfer(t, b, a, 20)) // credits still land
	refused(t, "a second freeze", f.Apply(t, change(t, f, ledger.TypeFreeze, a))[0], ledger.CodeAccountFrozen)
	if r := f.Apply(t, freeze)[0]; r.Kind != ledger.Duplicate || r.Action == nil || r.Account == nil || !r.Account.Frozen {
		t.Fatalf("the freeze again: %+v, want a duplicate with its record and the account", r)
	}
	other := freeze
	other.Type = ledger.TypeUnfreeze
	if r := f.Apply(t, other)[0]; r.Kind != ledger.Conflict {
		t.Fatalf("an unfreeze under the freeze's key: %v %v, want a conflict", r.Kind, r.Err)
	}
	f.MustApply(t, change(t, f, ledger.TypeUnfreeze, a))
	refused(t, "an unfreeze of an account not frozen", f.Apply(t, change(t, f, ledger.TypeUnfreeze, a))[0], ledger.CodeAccountNotFrozen)
	if r := f.Apply(t, freeze)[0]; r.Kind != ledger.Duplicate || r.Account == nil || r.Account.Frozen {
		t.Fatalf("the freeze after the unfreeze: %+v, want a duplicate answered with the account as it is now (not frozen)", r)
	}

	// Closing: 120 left on a, then a hold of 20.
	refused(t, "a close with money", f.Apply(t, change(t, f, ledger.TypeClose, a))[0], ledger.CodeAccountNotEmpty)
	f.MustApply(t, f.Transfer(t, a, b, 100))
	h := hold(t, f, a, b, 20, time.Hour)
	f.MustApply(t, h)
	refused(t, "a close with an open hold", f.Apply(t, change(t, f, ledger.TypeClose, a))[0], ledger.CodeAccountNotEmpty)
	f.MustApply(t, action(t, f, ledger.TypeCapture, h, 0))
	// One batch: the close and a credit after it; the credit sees it closed.
	closing := change(t, f, ledger.TypeClose, a)
	rs := f.Apply(t, closing, f.Transfer(t, b, a, 5), change(t, f, ledger.TypeFreeze, a))
	if rs[0].Kind != ledger.Applied || rs[0].Account == nil || !rs[0].Account.Closed {
		t.Fatalf("close: %+v, want the account closed", rs[0])
	}
	refused(t, "a credit of a closed account", rs[1], ledger.CodeAccountClosed)
	refused(t, "a freeze of a closed account", rs[2], ledger.CodeAccountClosed)
	refused(t, "a second close", f.Apply(t, change(t, f, ledger.TypeClose, a))[0], ledger.CodeAccountClosed)
	if got := account(t, f, a); !got.Closed || got.Balance != 0 || got.Held != 0 {
		t.Fatalf("after close: %+v", got)
	}

	// Another client's account: nothing recorded, dead-lettered.
	forged := change(t, f, ledger.TypeFreeze, b)
	forged.ClientID = "c2"
	if r := f.Apply(t, forged)[0]; r.Kind != ledger.Invalid || !r.DeadLetter || r.Err.Code != ledger.CodeAccountNotFound {
		t.Fatalf("a freeze of another client's account: %+v, want invalid and dead-lettered", r)
	}
	if got := account(t, f, b); got.Frozen {
		t.Fatal("another client froze the account")
	}
	if n := f.Count(t, `SELECT count(*) FROM account_actions WHERE client_id = 'c2'`); n != 0 {
		t.Fatalf("%d records of the forged freeze", n)
	}
	if n := f.Count(t, `SELECT count(*) FROM account_actions WHERE account_id = $1`, a); n != 9 {
		t.Fatalf("%d records of a's actions, want 9 (3 applied, 6 refused)", n)
	}
	f.MustVerify(t)
}

// TestCloseAcrossRegions: a close waits for the account's transfers on
// their way to another region (their refusal would credit it back); once
// closed, a credit from another region is refused there and refunded to
// its sender.
func TestCloseAcrossRegions(t *testing.T) {
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	regions := map[string]*ledgertest.Fixture{"eu": eu, "us": us}
	a, b := eu.Account(t, "EUR", 100), us.Account(t, "EUR", 0)
	out := eu.Transfer(t, a, b, 100)
	eu.MustApply(t, out)
	refused(t, "a close with a transfer in flight", eu.Apply(t, change(t, eu, ledger.TypeClose, a))[0], ledger.CodeAccountNotEmpty)
	relay(t, eu, regions) // the credit in us
	relay(t, us, regions) // its confirm in eu
	eu.MustApply(t, change(t, eu, ledger.TypeClose, a))

	// us pays the closed account back: refused in eu, refunded in us.
	back := us.Transfer(t, b, a, 60)
	us.MustApply(t, back)
	if rs := relay(t, us, regions); len(rs) != 1 || rs[0].Credit == nil || rs[0].Credit.Status != ledger.CreditRefused || rs[0].Credit.Reason != ledger.CodeAccountClosed {
		t.Fatalf("credit of the closed account: %+v, want refused account_closed", rs)
	}
	relay(t, eu, regions) // the refuse step in us
	if got := transferStatus(t, us, back.TransferID); got.Status != ledger.StatusRefunded || got.Reason != ledger.CodeAccountClosed {
		t.Fatalf("transfer to the closed account: %s %s, want REFUNDED account_closed", got.Status, got.Reason)
	}
	if got := us.Balance(t, b); got != 100 {
		t.Fatalf("sender after the refund: %d, want 100", got)
	}
	if got := account(t, eu, a); !got.Closed || got.Balance != 0 {
		t.Fatalf("closed account: %+v", got)
	}
	for _, f := range []*ledgertest.Fixture{eu, us} {
		f.MustVerify(t)
	}
}
