package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// relay moves every unsent outbox row of from to the ledger it names, the
// way the router does, and returns the results there.
func relay(tb testing.TB, from *ledgertest.Fixture, to map[string]*ledgertest.Fixture) []ledger.Result {
	tb.Helper()
	ctx := context.Background()
	rows, err := from.Store.PendingOutbox(ctx, 1000)
	if err != nil {
		tb.Fatal(err)
	}
	var out []ledger.Result
	var ids []int64
	for _, r := range rows {
		cmd, err := ledger.DecodeCommand(r.Payload)
		if err != nil {
			tb.Fatal(err)
		}
		if r.MsgID != cmd.MsgKey() {
			tb.Fatalf("outbox msg id %s, want %s", r.MsgID, cmd.MsgKey())
		}
		if err := cmd.Validate(r.Region, from.Regions, from.Clock.Now()); err != nil {
			tb.Fatalf("relayed step does not validate in %s: %v", r.Region, err)
		}
		out = append(out, to[r.Region].Apply(tb, cmd)...)
		ids = append(ids, r.ID)
	}
	if err := from.Store.MarkSent(ctx, ids); err != nil {
		tb.Fatal(err)
	}
	return out
}

func transferStatus(tb testing.TB, f *ledgertest.Fixture, id string) ledger.Transfer {
	tb.Helper()
	t, err := f.Store.Transfer(context.Background(), id)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// TestCrossRegionSaga runs transfers eu→us through the saga by hand: debit
// into transit with an outbox step, credit in us, confirm back in eu; a
// credit refused in us refunds in eu. Repeated and early steps never apply
// twice or move a transfer backwards.
func TestCrossRegionSaga(t *testing.T) {
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	regions := map[string]*ledgertest.Fixture{"eu": eu, "us": us}
	a := eu.Account(t, "EUR", 1000)
	b := us.Account(t, "EUR", 0)
	usd := us.Account(t, "USD", 0)

	t.Run("Completed", func(t *testing.T) {
		cmd := eu.Transfer(t, a, b, 300)
		r := eu.Apply(t, cmd)[0]
		if r.Kind != ledger.Applied || r.Transfer.Status != ledger.StatusDebited {
			t.Fatalf("debit: got %v %s, want applied DEBITED", r.Kind, r.Transfer.Status)
		}
		if got := eu.Balance(t, a); got != 700 {
			t.Fatalf("source after debit: got %d, want 700", got)
		}
		credits := relay(t, eu, regions)
		if len(credits) != 1 || credits[0].Kind != ledger.Applied || credits[0].Credit.Status != ledger.CreditApplied {
			t.Fatalf("credit: got %+v", credits)
		}
		if got := us.Balance(t, b); got != 300 {
			t.Fatalf("destination: got %d, want 300", got)
		}
		// The credit step delivered again: the consume-log catches it.
		credit := cmd.Step(ledger.TypeCredit, "")
		if r := us.Apply(t, credit)[0]; r.Kind != ledger.Duplicate {
			t.Fatalf("repeated credit: got %v, want duplicate", r.Kind)
		}
		confirms := relay(t, us, regions)
		if len(confirms) != 1 || confirms[0].Kind != ledger.Applied || confirms[0].Transfer.Status != ledger.StatusCompleted {
			t.Fatalf("confirm: got %+v", confirms)
		}
		// A refuse arriving after the confirm cannot move the transfer back.
		if r := eu.Apply(t, cmd.Step(ledger.TypeRefuse, ledger.CodeAccountClosed))[0]; r.Kind != ledger.Invalid || !r.DeadLetter {
			t.Fatalf("refuse after confirm: got %v, want invalid and dead-lettered", r.Kind)
		}
		if got := transferStatus(t, eu, cmd.TransferID); got.Status != ledger.StatusCompleted || got.Version != 2 {
			t.Fatalf("final: got %s v%d, want COMPLETED v2", got.Status, got.Version)
		}
	})

	t.Run("RefundedWhenDestinationMissing", func(t *testing.T) {
		before := eu.Balance(t, a)
		for _, cmd := range []ledger.Command{eu.Transfer(t, a, us.ID(t), 50), eu.Transfer(t, a, usd, 60)} {
			eu.MustApply(t, cmd)
			refusals := relay(t, eu, regions)
			if len(refusals) != 1 || refusals[0].Credit.Status != ledger.CreditRefused {
				t.Fatalf("credit: got %+v, want refused", refusals)
			}
			rs := relay(t, us, regions)
			if len(rs) != 1 || rs[0].Transfer.Status != ledger.StatusRefunded {
				t.Fatalf("refund: got %+v", rs)
			}
			if got := eu.Balance(t, a); got != before {
				t.Fatalf("source after refund: got %d, want %d", got, before)
			}
		}
	})

	t.Run("StepsOutOfOrder", func(t *testing.T) {
		cmd := eu.Transfer(t, a, b, 10)
		// A confirm that overtakes the debit is parked, not applied.
		if r := eu.Apply(t, cmd.Step(ledger.TypeConfirm, ""))[0]; r.Kind != ledger.Parked {
			t.Fatalf("early confirm: got %v, want parked", r.Kind)
		}
		eu.MustApply(t, cmd)
		relay(t, eu, regions)
		relay(t, us, regions)
		// The parked confirm comes back after the real one: caught by the
		// state machine or the consume-log, never applied twice.
		r := eu.Apply(t, cmd.Step(ledger.TypeConfirm, ""))[0]
		if r.Kind != ledger.Duplicate {
			t.Fatalf("late confirm: got %v, want duplicate", r.Kind)
		}
		if got := transferStatus(t, eu, cmd.TransferID); got.Status != ledger.StatusCompleted || got.Version != 2 {
			t.Fatalf("final: got %s v%d, want COMPLETED v2", got.Status, got.Version)
		}
	})

	t.Run("CreditsAndConfirmationsReordered", func(t *testing.T) {
		ctx := context.Background()
		var cmds []ledger.Command
		for i := range 4 {
			to := b
			if i == 2 {
				to = us.ID(t) // refused: its refuse step travels with the confirms
			}
			cmd := eu.Transfer(t, a, to, int64(10+i))
			eu.MustApply(t, cmd)
			cmds = append(cmds, cmd)
		}
		// Apply each hop's steps newest first, each twice.
		for _, hop := range []*ledgertest.Fixture{eu, us} {
			rows, err := hop.Store.PendingOutbox(ctx, 100)
			if err != nil {
				t.Fatal(err)
			}
			var ids []int64
			for i := len(rows) - 1; i >= 0; i-- {
				cmd, err := ledger.DecodeCommand(rows[i].Payload)
				if err != nil {
					t.Fatal(err)
				}
				target := regions[rows[i].Region]
				target.Apply(t, cmd)
				if r := target.Apply(t, cmd)[0]; r.Kind != ledger.Duplicate {
					t.Fatalf("step %s again: got %v, want duplicate", cmd.MsgKey(), r.Kind)
				}
				ids = append(ids, rows[i].ID)
			}
			if err := hop.Store.MarkSent(ctx, ids); err != nil {
				t.Fatal(err)
			}
		}
		for i, cmd := range cmds {
			want := ledger.StatusCompleted
			if i == 2 {
				want = ledger.StatusRefunded
			}
			if got := transferStatus(t, eu, cmd.TransferID); got.Status != want || got.Version != 2 {
				t.Errorf("transfer %d: got %s v%d, want %s v2", i, got.Status, got.Version, want)
			}
		}
	})

	if dups := eu.Stats.Duplicates(); dups[string(ledger.LayerConsumeLog)]+dups[string(ledger.LayerStateCAS)] == 0 {
		t.Errorf("eu duplicates by layer: %v", dups)
	}
	eu.MustVerify(t)
	us.MustVerify(t)
	rep, err := postgres.VerifyGlobal(context.Background(), []*postgres.Store{eu.Store, us.Store}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("global verify:\n%s", rep)
	}
}

// lateRefusal completes a transfer eu→us through the saga, then hands eu a
// refusal of its credit, out of order: the state machine must refuse it. It
// returns what went wrong. With forget, eu's database is sabotaged first: it
// forgets that the transfer completed (its row is set back to DEBITED), as
// a ledger without the state machine's transition check and compare-and-set
// would treat it.
func lateRefusal(t *testing.T, forget bool) []string {
	ctx := context.Background()
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	regions := map[string]*ledgertest.Fixture{"eu": eu, "us": us}
	a, b := eu.Account(t, "EUR", 1000), us.Account(t, "EUR", 0)
	cmd := eu.Transfer(t, a, b, 300)
	eu.MustApply(t, cmd)
	relay(t, eu, regions)
	relay(t, us, regions)
	if forget {
		if _, err := eu.Pool.Exec(ctx, `UPDATE transfers SET status = 'DEBITED' WHERE id = $1`, cmd.TransferID); err != nil {
			t.Fatal(err)
		}
	}
	var problems []string
	if r := eu.Apply(t, cmd.Step(ledger.TypeRefuse, ledger.CodeAccountClosed))[0]; r.Kind != ledger.Invalid {
		problems = append(problems, fmt.Sprintf("a refusal after the confirmation was %v, want invalid", r.Kind))
	}
	if got := transferStatus(t, eu, cmd.TransferID); got.Status != ledger.StatusCompleted || got.Version != 2 {
		problems = append(problems, fmt.Sprintf("the transfer is %s v%d, want COMPLETED v2", got.Status, got.Version))
	}
	if got := eu.Balance(t, a); got != 700 {
		problems = append(problems, fmt.Sprintf("the source holds %d, want 700 (credited in us and refunded in eu)", got))
	}
	rep, err := postgres.VerifyGlobal(ctx, []*postgres.Store{eu.Store, us.Store}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		problems = append(problems, "global verify failed:\n"+rep.String())
	}
	return problems
}

// TestLateRefusalRefused: a refusal that arrives after the confirmation
// (its consume-log key is new, so only the state machine stands in its
// way) changes nothing. With the state machine kept from seeing the
// completion (a sabotage of the test's own database), the same test fails:
// the refusal applies and the completed transfer is refunded too.
func TestLateRefusalRefused(t *testing.T) {
	if p := lateRefusal(t, false); len(p) > 0 {
		t.Fatalf("out-of-order refusal: %v", p)
	}
	p := lateRefusal(t, true)
	joined := strings.Join(p, "\n")
	for _, want := range []string{"a refusal after the confirmation was applied", "the source holds 1000", "global verify failed"} {
		if !strings.Contains(joined, want) {
			t.Errorf("with the completion forgotten, the out-of-order test does not say %q: it cannot see the bug (it says %v)", want, p)
		}
	}
	t.Logf("with the completion forgotten: %v", p)
}
