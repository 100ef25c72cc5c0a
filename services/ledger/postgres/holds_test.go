package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// hold builds a hold of amount from one account to another, expiring in d.
func hold(tb testing.TB, f *ledgertest.Fixture, from, to string, amount int64, d time.Duration) ledger.Command {
	tb.Helper()
	c := f.Transfer(tb, from, to, amount)
	c.Hold, c.ExpiresAt = true, c.CreatedAt.Add(d)
	return c
}

// action builds a capture or void of the hold h by its client, with a key of
// its own.
func action(tb testing.TB, f *ledgertest.Fixture, typ string, h ledger.Command, amount int64) ledger.Command {
	tb.Helper()
	return ledger.Command{Type: typ, TransferID: h.TransferID, ClientID: h.ClientID, IdempotencyKey: typ + "-" + f.ID(tb),
		From: h.From, To: h.To, Amount: amount, Currency: h.Currency, CreatedAt: f.Clock.Now()}
}

// refund builds the payee's refund of the transfer p, of amount (0: all
// that is left), made in the payee's region f.
func refund(tb testing.TB, f *ledgertest.Fixture, p ledger.Command, amount int64) ledger.Command {
	tb.Helper()
	return ledger.Command{Type: ledger.TypeRefund, TransferID: f.ID(tb), ClientID: "c1", IdempotencyKey: "refund-" + f.ID(tb),
		From: p.To, To: p.From, Amount: amount, Currency: p.Currency, CreatedAt: f.Clock.Now(), RefundOf: p.TransferID}
}

func account(tb testing.TB, f *ledgertest.Fixture, id string) ledger.Account {
	tb.Helper()
	a, err := f.Store.Account(context.Background(), id)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// refused fails unless r is a refusal with code.
func refused(tb testing.TB, what string, r ledger.Result, code ledger.Code) {
	tb.Helper()
	if r.Kind != ledger.Rejected || r.Err == nil || r.Err.Code != code {
		tb.Fatalf("%s: got %v %v, want rejected %s", what, r.Kind, r.Err, code)
	}
}

// TestHolds runs every transition of a hold, and every illegal one, within
// one region: a hold reserves without moving money; a capture (in part or
// whole) moves the captured amount and releases the rest; a void and an
// expiry release it all; whatever comes after the one that won is refused
// with a stable code and moves nothing.
func TestHolds(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)

	h := hold(t, f, a, b, 60, time.Hour)
	if r := f.MustApply(t, h); r.Transfer.Status != ledger.StatusHeld {
		t.Fatalf("hold: got %s, want HELD", r.Transfer.Status)
	}
	if acc := account(t, f, a); acc.Balance != 100 || acc.Held != 60 || acc.Available() != 40 {
		t.Fatalf("after hold: balance %d held %d available %d, want 100 60 40", acc.Balance, acc.Held, acc.Available())
	}
	// What is held cannot be spent again.
	refused(t, "debit past the available", f.Apply(t, f.Transfer(t, a, b, 41))[0], ledger.CodeInsufficientFunds)
	refused(t, "a second hold past the available", f.Apply(t, hold(t, f, a, b, 41, time.Hour))[0], ledger.CodeInsufficientFunds)
	// The expiry is queued, not due yet.
	if rows, _ := f.Store.PendingOutbox(ctx, 10); len(rows) != 0 {
		t.Fatalf("outbox before the expiry: %d rows due, want 0", len(rows))
	}

	t.Run("CaptureInPart", func(t *testing.T) {
		refused(t, "capture over the hold", f.Apply(t, action(t, f, ledger.TypeCapture, h, 61))[0], ledger.CodeAmountExceedsHold)
		other := action(t, f, ledger.TypeCapture, h, 10)
		other.ClientID = "c2"
		refused(t, "another client's capture", f.Apply(t, other)[0], ledger.CodeNotFound)
		r := f.MustApply(t, action(t, f, ledger.TypeCapture, h, 25))
		if r.Transfer.Status != ledger.StatusCompleted || r.Transfer.CapturedAmount != 25 || r.Transfer.Version != 2 {
			t.Fatalf("capture: got %s captured %d v%d, want COMPLETED 25 v2", r.Transfer.Status, r.Transfer.CapturedAmount, r.Transfer.Version)
		}
		if acc := account(t, f, a); acc.Balance != 75 || acc.Held != 0 {
			t.Fatalf("source after capture: balance %d held %d, want 75 0", acc.Balance, acc.Held)
		}
		if got := f.Balance(t, b); got != 25 {
			t.Fatalf("destination after capture: %d, want 25", got)
		}
		if n := f.Count(t, `SELECT count(*) FROM outbox WHERE msg_id = $1`, "step/"+h.TransferID+"/expire"); n != 0 {
			t.Fatalf("expiry step after the capture: %d rows, want it deleted", n)
		}
		// Everything after the capture is refused and moves nothing.
		illegal := f.Stats.IllegalTransitions.Load()
		refused(t, "second capture", f.Apply(t, action(t, f, ledger.TypeCapture, h, 0))[0], ledger.CodeTransferNotHeld)
		refused(t, "void after capture", f.Apply(t, action(t, f, ledger.TypeVoid, h, 0))[0], ledger.CodeTransferNotHeld)
		if got := f.Stats.IllegalTransitions.Load() - illegal; got != 2 {
			t.Fatalf("illegal transitions counted: %d, want 2", got)
		}
		exp := ledger.StepOf(r.Transfer, ledger.TypeExpire, h.Amount, "")
		f.Clock.Step(2 * time.Hour)
		if r := f.Apply(t, exp)[0]; r.Kind != ledger.Duplicate || r.Layer != ledger.LayerStateCAS {
			t.Fatalf("expiry after capture: got %v/%s, want duplicate caught by the state CAS", r.Kind, r.Layer)
		}
		f.Clock.Step(-2 * time.Hour)
		if got := f.Balance(t, a); got != 75 {
			t.Fatalf("source after the refusals: %d, want 75", got)
		}
	})

	t.Run("CaptureAll", func(t *testing.T) {
		h := f.MustApply(t, hold(t, f, a, b, 30, time.Hour)).Transfer
		c := action(t, f, ledger.TypeCapture, ledger.Command{TransferID: h.ID, ClientID: "c1", From: a, To: b, Currency: "EUR"}, 0)
		if r := f.MustApply(t, c); r.Transfer.CapturedAmount != 30 {
			t.Fatalf("capture without an amount: captured %d, want 30", r.Transfer.CapturedAmount)
		}
		if acc := account(t, f, a); acc.Balance != 45 || acc.Held != 0 {
			t.Fatalf("source: balance %d held %d, want 45 0", acc.Balance, acc.Held)
		}
	})

	t.Run("Expire", func(t *testing.T) {
		h := hold(t, f, a, b, 20, time.Minute)
		f.MustApply(t, h)
		exp := ledger.StepOf(transferStatus(t, f, h.TransferID), ledger.TypeExpire, h.Amount, "")
		if r := f.Apply(t, exp)[0]; r.Kind != ledger.Parked {
			t.Fatalf("expiry before it is due: got %v, want parked", r.Kind)
		}
		f.Clock.Step(time.Minute)
		refused(t, "capture at the expiry", f.Apply(t, action(t, f, ledger.TypeCapture, h, 0))[0], ledger.CodeHoldExpired)
		rows, err := f.Store.PendingOutbox(ctx, 10)
		if err != nil || len(rows) != 1 || rows[0].MsgID != exp.MsgKey() || rows[0].Region != "eu" {
			t.Fatalf("due outbox: %+v %v, want the expiry step for eu", rows, err)
		}
		rs := relay(t, f, map[string]*ledgertest.Fixture{"eu": f})
		if len(rs) != 1 || rs[0].Kind != ledger.Applied || rs[0].Transfer.Status != ledger.StatusExpired {
			t.Fatalf("expiry: got %+v, want applied EXPIRED", rs)
		}
		if acc := account(t, f, a); acc.Held != 0 || acc.Balance != 45 {
			t.Fatalf("after expiry: balance %d held %d, want 45 0", acc.Balance, acc.Held)
		}
		refused(t, "capture after the expiry", f.Apply(t, action(t, f, ledger.TypeCapture, h, 0))[0], ledger.CodeTransferNotHeld)
		refused(t, "void after the expiry", f.Apply(t, action(t, f, ledger.TypeVoid, h, 0))[0], ledger.CodeTransferNotHeld)
	})

	t.Run("NotAHold", func(t *testing.T) {
		p := f.Transfer(t, a, b, 5)
		f.MustApply(t, p)
		refused(t, "capture of a transfer", f.Apply(t, action(t, f, ledger.TypeCapture, p, 0))[0], ledger.CodeTransferNotHeld)
		refused(t, "void of a transfer", f.Apply(t, action(t, f, ledger.TypeVoid, p, 0))[0], ledger.CodeTransferNotHeld)
		missing := action(t, f, ledger.TypeVoid, p, 0)
		missing.TransferID = f.ID(t)
		refused(t, "void of no transfer", f.Apply(t, missing)[0], ledger.CodeNotFound)
	})

	t.Run("StaleVersionABA", func(t *testing.T) {
		// A writer that read the hold HELD v1 loses once it moved on.
		h := hold(t, f, a, b, 5, time.Hour)
		read := f.MustApply(t, h).Transfer
		f.MustApply(t, action(t, f, ledger.TypeVoid, h, 0))
		tag, err := f.Pool.Exec(ctx, postgres.AdvanceTransfersSQL, []string{read.ID}, []string{string(read.Status)}, []int64{read.Version},
			[]string{string(ledger.StatusCompleted)}, []int64{read.Version + 1}, []string{""}, []int64{5})
		if err != nil || tag.RowsAffected() != 0 {
			t.Fatalf("stale hold CAS: updated %d rows (%v), want 0", tag.RowsAffected(), err)
		}
	})
	f.MustVerify(t)
}

// TestHoldVoid: a void releases the whole hold once; repeats of the void,
// and every capture after it, are refused or replayed.
func TestHoldVoid(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	h := hold(t, f, a, b, 70, time.Hour)
	f.MustApply(t, h)
	v := action(t, f, ledger.TypeVoid, h, 0)
	if r := f.MustApply(t, v); r.Transfer.Status != ledger.StatusVoided || r.Transfer.Version != 2 {
		t.Fatalf("void: got %s v%d, want VOIDED v2", r.Transfer.Status, r.Transfer.Version)
	}
	if acc := account(t, f, a); acc.Balance != 100 || acc.Held != 0 {
		t.Fatalf("after void: balance %d held %d, want 100 0", acc.Balance, acc.Held)
	}
	refused(t, "capture after void", f.Apply(t, action(t, f, ledger.TypeCapture, h, 0))[0], ledger.CodeTransferNotHeld)
	withAmount := action(t, f, ledger.TypeVoid, h, 1)
	if err := withAmount.Validate("eu", f.Regions, f.Clock.Now()); ledger.ErrorCode(err) != ledger.CodeInvalidAmount {
		t.Fatalf("void with an amount: got %v, want invalid_amount", err)
	}
	f.MustVerify(t)
}

// TestActionRedelivered: each new command delivered 1, 2 and 50 times has
// one effect; the repeats are caught (consume-log, or the action's record
// once the consume-log row is gone).
func TestActionRedelivered(t *testing.T) {
	for _, n := range []int{1, 2, 50} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			f := ledgertest.New(t)
			a, b := f.Account(t, "EUR", 1000), f.Account(t, "EUR", 0)
			h1, h2, h3 := hold(t, f, a, b, 100, time.Hour), hold(t, f, a, b, 100, time.Hour), hold(t, f, a, b, 100, time.Minute)
			p := f.Transfer(t, a, b, 100)
			for _, c := range []ledger.Command{h1, h2, h3, p} {
				f.MustApply(t, c)
			}
			capture, void := action(t, f, ledger.TypeCapture, h1, 40), action(t, f, ledger.TypeVoid, h2, 0)
			ref := refund(t, f, p, 30)
			for _, c := range []ledger.Command{capture, void, ref} {
				applied := 0
				for range n {
					switch r := f.Apply(t, c)[0]; r.Kind {
					case ledger.Applied:
						applied++
					case ledger.Duplicate:
					default:
						t.Fatalf("%s delivery: got %v %v", c.Type, r.Kind, r.Err)
					}
				}
				if applied != 1 {
					t.Fatalf("%s delivered %d times: applied %d times, want once", c.Type, n, applied)
				}
			}
			f.Clock.Step(time.Minute)
			exp := ledger.StepOf(transferStatus(t, f, h3.TransferID), ledger.TypeExpire, h3.Amount, "")
			applied := 0
			for range n {
				if r := f.Apply(t, exp)[0]; r.Kind == ledger.Applied {
					applied++
				} else if r.Kind != ledger.Duplicate {
					t.Fatalf("expiry delivery: got %v %v", r.Kind, r.Err)
				}
			}
			if applied != 1 {
				t.Fatalf("expiry delivered %d times: applied %d times", n, applied)
			}
			// 1000 - 40 captured - 100 paid + 30 refunded.
			if acc := account(t, f, a); acc.Balance != 890 || acc.Held != 0 {
				t.Fatalf("source: balance %d held %d, want 890 0", acc.Balance, acc.Held)
			}
			f.MustVerify(t)
		})
	}
	t.Run("AfterTheConsumeLog", func(t *testing.T) {
		// A capture repeated after its consume-log row expired is caught by
		// its record (the business key), with its key.
		f := ledgertest.New(t)
		a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
		h := hold(t, f, a, b, 50, 10*24*time.Hour)
		f.MustApply(t, h)
		c := action(t, f, ledger.TypeCapture, h, 0)
		f.MustApply(t, c)
		f.Clock.Step(5 * 24 * time.Hour)
		if _, err := f.Log.Maintain(context.Background(), f.Pool); err != nil {
			t.Fatal(err)
		}
		if r := f.Apply(t, c)[0]; r.Kind != ledger.Duplicate || r.Layer != ledger.LayerBusinessKey {
			t.Fatalf("late capture: got %v/%s, want duplicate at the business key", r.Kind, r.Layer)
		}
		other := c
		other.Amount = 10
		if r := f.Apply(t, other)[0]; r.Kind != ledger.Conflict {
			t.Fatalf("same key, other capture: got %v, want conflict", r.Kind)
		}
		if got := f.Balance(t, a); got != 50 {
			t.Fatalf("balance: %d, want 50", got)
		}
	})
}

// race applies each command in a transaction of its own, all at once, and
// returns the results in order.
func race(tb testing.TB, stores []*postgres.Store, cmds []ledger.Command) []ledger.Result {
	tb.Helper()
	out := make([]ledger.Result, len(cmds))
	errs := make([]error, len(cmds))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range cmds {
		wg.Go(func() {
			<-start
			rs, err := stores[i%len(stores)].Apply(context.Background(), []ledger.Command{c})
			if err == nil {
				out[i] = rs[0]
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

// TestHoldRaces: a capture against a void, and a capture against the
// expiry, run at once many times. Exactly one wins each time; the loser
// moves nothing and is answered with a stable code (or, for the expiry, is
// a duplicate caught by the state machine).
func TestHoldRaces(t *testing.T) {
	f := ledgertest.New(t)
	// A second ledger process on the same database, whose clock is past
	// every hold's expiry: its expiry steps race the first one's captures.
	late := ledgertest.On(t, f.Pool, f.URL)
	late.Clock.Step(2 * time.Hour)
	a, b := f.Account(t, "EUR", 10_000), f.Account(t, "EUR", 0)
	const rounds = 40
	var captured, voided, expired int64
	for i := range rounds {
		h := hold(t, f, a, b, 10, time.Hour)
		held := f.MustApply(t, h).Transfer
		other := action(t, f, ledger.TypeVoid, h, 0)
		stores := []*postgres.Store{f.Store, f.Store}
		if i%2 == 1 {
			other = ledger.StepOf(held, ledger.TypeExpire, h.Amount, "")
			stores[1] = late.Store
		}
		rs := race(t, stores, []ledger.Command{action(t, f, ledger.TypeCapture, h, 7), other})
		wins := 0
		for _, r := range rs {
			if r.Kind == ledger.Applied {
				wins++
			}
		}
		final := transferStatus(t, f, h.TransferID)
		switch {
		case wins != 1:
			t.Fatalf("round %d: %d applied (%v %v / %v %v), want exactly one", i, wins, rs[0].Kind, rs[0].Err, rs[1].Kind, rs[1].Err)
		case rs[0].Kind == ledger.Applied:
			captured++
			if other.Type == ledger.TypeVoid {
				refused(t, "void after capture", rs[1], ledger.CodeTransferNotHeld)
			} else if rs[1].Kind != ledger.Duplicate || rs[1].Layer != ledger.LayerStateCAS {
				t.Fatalf("round %d: expiry after capture got %v/%s, want a state-CAS duplicate", i, rs[1].Kind, rs[1].Layer)
			}
		case final.Status == ledger.StatusVoided:
			voided++
			refused(t, "capture after void", rs[0], ledger.CodeTransferNotHeld)
		default:
			expired++
			refused(t, "capture after expiry", rs[0], ledger.CodeTransferNotHeld)
		}
	}
	t.Logf("%d rounds: %d captured, %d voided, %d expired", rounds, captured, voided, expired)
	acc := account(t, f, a)
	if acc.Held != 0 || acc.Balance != 10_000-7*captured {
		t.Fatalf("source: balance %d held %d, want %d 0", acc.Balance, acc.Held, 10_000-7*captured)
	}
	f.MustVerify(t)
}

// TestRefunds: a payee refunds a transfer in parts up to what it moved,
// never past it, also when several refunds race; a refund of a captured
// hold is capped by the captured amount.
func TestRefunds(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 1000), f.Account(t, "EUR", 0)
	p := f.Transfer(t, a, b, 100)
	f.MustApply(t, p)

	r1 := f.MustApply(t, refund(t, f, p, 30))
	if r1.Transfer.Status != ledger.StatusCompleted || r1.Transfer.RefundOf != p.TransferID || r1.Transfer.Amount != 30 {
		t.Fatalf("refund: got %+v", r1.Transfer)
	}
	refused(t, "refund past what is left", f.Apply(t, refund(t, f, p, 71))[0], ledger.CodeRefundExceedsCaptured)
	if r := f.MustApply(t, refund(t, f, p, 0)); r.Transfer.Amount != 70 {
		t.Fatalf("refund of the rest: %d, want 70", r.Transfer.Amount)
	}
	refused(t, "refund of nothing left", f.Apply(t, refund(t, f, p, 0))[0], ledger.CodeRefundExceedsCaptured)
	if got := transferStatus(t, f, p.TransferID).RefundedAmount; got != 100 {
		t.Fatalf("refunded amount: %d, want 100", got)
	}
	refused(t, "refund of a refund", f.Apply(t, refund(t, f, ledger.Command{TransferID: r1.Transfer.ID, From: b, To: a, Currency: "EUR"}, 1))[0],
		ledger.CodeTransferNotRefundable)

	t.Run("OfAHold", func(t *testing.T) {
		h := hold(t, f, a, b, 50, time.Hour)
		f.MustApply(t, h)
		refused(t, "refund of an open hold", f.Apply(t, refund(t, f, h, 10))[0], ledger.CodeTransferNotRefundable)
		f.MustApply(t, action(t, f, ledger.TypeCapture, h, 20))
		refused(t, "refund past the captured amount", f.Apply(t, refund(t, f, h, 21))[0], ledger.CodeRefundExceedsCaptured)
		f.MustApply(t, refund(t, f, h, 20))
	})

	t.Run("PayeeCannotCover", func(t *testing.T) {
		c := f.Account(t, "EUR", 0)
		p := f.Transfer(t, a, c, 10)
		f.MustApply(t, p)
		f.MustApply(t, f.Transfer(t, c, b, 10)) // the payee spent it
		refused(t, "refund the payee cannot cover", f.Apply(t, refund(t, f, p, 10))[0], ledger.CodeInsufficientFunds)
		if got := transferStatus(t, f, p.TransferID).RefundedAmount; got != 0 {
			t.Fatalf("refunded after a refused refund: %d, want 0", got)
		}
	})

	t.Run("Racing", func(t *testing.T) {
		second := ledgertest.On(t, f.Pool, f.URL)
		for round := range 10 {
			p := f.Transfer(t, a, b, 100)
			f.MustApply(t, p)
			var cmds []ledger.Command
			for range 5 {
				cmds = append(cmds, refund(t, f, p, 30))
			}
			rs := race(t, []*postgres.Store{f.Store, second.Store}, cmds)
			applied := 0
			for _, r := range rs {
				switch {
				case r.Kind == ledger.Applied:
					applied++
				default:
					refused(t, "a refund past the total", r, ledger.CodeRefundExceedsCaptured)
				}
			}
			if applied != 3 {
				t.Fatalf("round %d: %d refunds of 30 applied against 100, want 3", round, applied)
			}
		}
	})
	f.MustVerify(t)
}

// TestHoldsAcrossRegions: a hold in eu captured in part to an account in
// us moves through the saga (debit into transit, credit, confirm); the
// payee in us refunds it in parts, back through the saga, capped by the
// captured amount in us, where every refund of it is decided; a refund
// that eu refuses gives the refundable amount back. Every step redelivered
// applies once.
func TestHoldsAcrossRegions(t *testing.T) {
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	regions := map[string]*ledgertest.Fixture{"eu": eu, "us": us}
	a, b := eu.Account(t, "EUR", 1000), us.Account(t, "EUR", 0)

	h := hold(t, eu, a, b, 300, time.Hour)
	eu.MustApply(t, h)
	c := action(t, eu, ledger.TypeCapture, h, 200)
	if r := eu.MustApply(t, c); r.Transfer.Status != ledger.StatusDebited || r.Transfer.CapturedAmount != 200 {
		t.Fatalf("capture: got %s captured %d, want DEBITED 200", r.Transfer.Status, r.Transfer.CapturedAmount)
	}
	if acc := account(t, eu, a); acc.Balance != 800 || acc.Held != 0 {
		t.Fatalf("source: balance %d held %d, want 800 0", acc.Balance, acc.Held)
	}
	credits := relay(t, eu, regions)
	if len(credits) != 1 || credits[0].Credit == nil || credits[0].Credit.Amount != 200 {
		t.Fatalf("credit: got %+v, want one credit of 200", credits)
	}
	// Every saga step of the capture, delivered again 1, 2 and 50 times,
	// is a duplicate (the credit's business key, the confirm's state CAS).
	steps := func(cmd ledger.Command) (credit, confirm ledger.Command) {
		rows, err := us.Store.PendingOutbox(context.Background(), 10)
		if err != nil || len(rows) != 1 {
			t.Fatalf("the credit's answer: %+v %v", rows, err)
		}
		confirm, err = ledger.DecodeCommand(rows[0].Payload)
		if err != nil {
			t.Fatal(err)
		}
		return cmd, confirm
	}
	credit, confirm := steps(ledger.StepOf(transferStatus(t, eu, h.TransferID), ledger.TypeCredit, 200, ""))
	credit.CreatedAt = confirm.CreatedAt
	if rs := relay(t, us, regions); len(rs) != 1 || rs[0].Transfer.Status != ledger.StatusCompleted {
		t.Fatalf("confirm: got %+v", rs)
	}
	redeliver := func(f *ledgertest.Fixture, c ledger.Command) {
		t.Helper()
		for _, n := range []int{1, 2, 50} {
			for range n {
				if r := f.Apply(t, c)[0]; r.Kind != ledger.Duplicate {
					t.Fatalf("%s delivered again: got %v %v, want duplicate", c.Type, r.Kind, r.Err)
				}
			}
		}
	}
	redeliver(us, credit)
	redeliver(eu, confirm)
	if got := us.Balance(t, b); got != 200 {
		t.Fatalf("payee: %d, want 200", got)
	}

	// The payee refunds 150 of it, then 60 more, which is too much.
	r := us.MustApply(t, refund(t, us, h, 150))
	if r.Transfer.Status != ledger.StatusDebited {
		t.Fatalf("refund: got %s, want DEBITED (the payer is in eu)", r.Transfer.Status)
	}
	refused(t, "refund past the captured amount", us.Apply(t, refund(t, us, h, 60))[0], ledger.CodeRefundExceedsCaptured)
	rows, err := us.Store.PendingOutbox(context.Background(), 10)
	if err != nil || len(rows) != 1 {
		t.Fatalf("the refund's credit step: %+v %v", rows, err)
	}
	refundCredit, err := ledger.DecodeCommand(rows[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	relay(t, us, regions) // credit the payer in eu
	rows, err = eu.Store.PendingOutbox(context.Background(), 10)
	if err != nil || len(rows) != 1 {
		t.Fatalf("the refund's confirm step: %+v %v", rows, err)
	}
	refundConfirm, err := ledger.DecodeCommand(rows[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	relay(t, eu, regions) // confirm in us
	redeliver(eu, refundCredit)
	redeliver(us, refundConfirm)
	if got := transferStatus(t, us, r.Transfer.ID); got.Status != ledger.StatusCompleted {
		t.Fatalf("refund after the saga: %s, want COMPLETED", got.Status)
	}
	if got := eu.Balance(t, a); got != 950 {
		t.Fatalf("payer after the refund: %d, want 950", got)
	}

	// eu refuses a refund's credit (the payer's account closed): the
	// money goes back to the payee, and that amount is refundable again.
	if err := eu.Store.CloseAccount(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	r2 := us.MustApply(t, refund(t, us, h, 50))
	relay(t, us, regions)
	relay(t, eu, regions)
	if got := transferStatus(t, us, r2.Transfer.ID); got.Status != ledger.StatusRefunded {
		t.Fatalf("refused refund: %s, want REFUNDED", got.Status)
	}
	if n := us.Count(t, `SELECT refunded_amount FROM credits WHERE transfer_id = $1`, h.TransferID); n != 150 {
		t.Fatalf("refunded amount of the credit: %d, want 150", n)
	}
	if got := us.Balance(t, b); got != 50 {
		t.Fatalf("payee: %d, want 50", got)
	}
	// The close behind the ledger's back is undone: verify holds a closed
	// account to a zero balance, which a close through the ledger needs.
	if _, err := eu.Pool.Exec(context.Background(), `UPDATE accounts SET closed = false WHERE id = $1`, a); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*ledgertest.Fixture{eu, us} {
		f.MustVerify(t)
	}
	rep, err := postgres.VerifyGlobal(context.Background(), []*postgres.Store{eu.Store, us.Store}, true)
	if err != nil || !rep.OK() {
		t.Fatalf("global verify: %v\n%s", err, rep)
	}
}

// TestVerifyHoldsAndRefunds: each invariant of holds and refunds fails on
// a tampered row, and names it.
func TestVerifyHoldsAndRefunds(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		check  string
		tamper string
	}{
		{"held equals the sum of open holds, within the floor", `UPDATE accounts SET held = held - 1 WHERE id = '{account}'`},
		{"held equals the sum of open holds, within the floor", `UPDATE transfers SET status = 'VOIDED' WHERE id = '{open}'`},
		{"held equals the sum of open holds, within the floor", `UPDATE transfers SET released_at = NULL WHERE id = '{done}'`},
		{"held equals the sum of open holds, within the floor", `UPDATE transfers SET held_at = released_at + interval '1 second' WHERE id = '{done}'`},
		{"held equals the sum of open holds, within the floor", `UPDATE transfers SET held_at = created_at WHERE id = '{paid}'`},
		{"captures stay within their holds", `UPDATE transfers SET captured_amount = NULL WHERE id = '{done}'`},
		{"no hold is both captured and voided or expired", `UPDATE transfer_actions SET type = 'void' WHERE transfer_id = '{done}'`},
		{"no hold is both captured and voided or expired", `UPDATE transfers SET status = 'EXPIRED' WHERE id = '{done}'`},
		{"refunds stay within what their transfer moved", `UPDATE transfers SET refunded_amount = 0 WHERE id = '{paid}'`},
		{"refunds stay within what their transfer moved", `UPDATE transfers SET amount = amount + 50 WHERE refund_of = '{paid}'`},
	} {
		t.Run(tc.check, func(t *testing.T) {
			f := ledgertest.New(t)
			a, b := f.Account(t, "EUR", 1000), f.Account(t, "EUR", 0)
			open := hold(t, f, a, b, 100, time.Hour)
			done := hold(t, f, a, b, 100, time.Hour)
			p := f.Transfer(t, a, b, 100)
			for _, c := range []ledger.Command{open, done, p} {
				f.MustApply(t, c)
			}
			f.MustApply(t, action(t, f, ledger.TypeCapture, done, 80))
			f.MustApply(t, refund(t, f, p, 60))
			f.MustVerify(t)
			// The checks are the ledger's own, not the schema's: the
			// tamper goes past the constraints that also guard them.
			if _, err := f.Pool.Exec(ctx, `ALTER TABLE transfers DROP CONSTRAINT transfers_hold_check, DROP CONSTRAINT transfers_refunded_check;
				ALTER TABLE accounts DROP CONSTRAINT accounts_held_check`); err != nil {
				t.Fatal(err)
			}
			tamper := strings.NewReplacer("{account}", a, "{done}", done.TransferID, "{open}", open.TransferID, "{paid}", p.TransferID).Replace(tc.tamper)
			if _, err := f.Pool.Exec(ctx, tamper); err != nil {
				t.Fatal(err)
			}
			rep, err := f.Store.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range rep.Checks {
				if c.Name == tc.check {
					if c.OK {
						t.Fatalf("%s passed on a tampered row:\n%s", tc.check, rep)
					}
					t.Logf("%s", c.Failures)
					return
				}
			}
			t.Fatalf("no check %q in:\n%s", tc.check, rep)
		})
	}
}

// TestHeldAt: what an account held at an instant is the sum of its holds
// open then, as the test itself tracks them between batches: a hold counts
// from its batch, stops counting at its capture or void, and a refused hold
// never counts; the balance at each instant is the test's own too.
func TestHeldAt(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	type want struct {
		at            time.Time
		balance, held int64
	}
	var wants []want
	note := func(balance, held int64) {
		time.Sleep(2 * time.Millisecond) // an instant strictly between batches
		wants = append(wants, want{time.Now(), balance, held})
		time.Sleep(2 * time.Millisecond)
	}
	note(100, 0)
	h1, h2 := hold(t, f, a, b, 30, time.Hour), hold(t, f, a, b, 20, time.Hour)
	f.Apply(t, h1, h2)
	note(100, 50)
	refused(t, "a hold over what is available", f.Apply(t, hold(t, f, a, b, 51, time.Hour))[0], ledger.CodeInsufficientFunds)
	note(100, 50)
	f.MustApply(t, action(t, f, ledger.TypeCapture, h1, 25)) // releases all 30, moves 25
	note(75, 20)
	f.MustApply(t, action(t, f, ledger.TypeVoid, h2, 0))
	note(75, 0)
	f.Apply(t, hold(t, f, a, b, 75, time.Hour))
	note(75, 75)
	for i, w := range wants {
		got, err := f.Store.BalanceAt(ctx, a, w.at)
		if err != nil {
			t.Fatal(err)
		}
		if got.Balance != w.balance || got.Held != w.held || got.Available() != w.balance-w.held {
			t.Errorf("instant %d: balance %d held %d available %d, want %d, %d and %d", i, got.Balance, got.Held, got.Available(),
				w.balance, w.held, w.balance-w.held)
		}
	}
	if now := account(t, f, a); now.Held != wants[len(wants)-1].held {
		t.Fatalf("held now %d, want %d", now.Held, wants[len(wants)-1].held)
	}
	if got, err := f.Store.BalanceAt(ctx, b, wants[0].at); err != nil || got != (ledger.Balance{}) {
		t.Fatalf("before any change: %+v %v, want zero", got, err)
	}
}

// TestHoldTimesMigration: holds recorded before migration 00011 get their
// times from their creation and settlement, so that verify passes on an
// upgraded ledger and the open hold is held now.
func TestHoldTimesMigration(t *testing.T) {
	ctx := context.Background()
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	open, captured, voided := hold(t, f, a, b, 10, time.Hour), hold(t, f, a, b, 20, time.Hour), hold(t, f, a, b, 30, time.Hour)
	f.Apply(t, open, captured, voided)
	refused(t, "a hold over what is available", f.Apply(t, hold(t, f, a, b, 41, time.Hour))[0], ledger.CodeInsufficientFunds)
	f.MustApply(t, action(t, f, ledger.TypeCapture, captured, 0))
	f.MustApply(t, action(t, f, ledger.TypeVoid, voided, 0))
	downTo(t, f, 10)
	if err := pgdb.Migrate(ctx, f.Pool, postgres.Migrations()...); err != nil {
		t.Fatal(err)
	}
	f.MustVerify(t)
	if got, err := f.Store.BalanceAt(ctx, a, time.Now()); err != nil || got.Held != 10 || got.Balance != 80 {
		t.Fatalf("after the migration: %+v %v, want balance 80 and the open hold's 10 held", got, err)
	}
}
