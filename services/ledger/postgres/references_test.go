package postgres_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
)

// referenced is a transfer from a to b with the client's reference and
// metadata.
func referenced(tb testing.TB, f *ledgertest.Fixture, a, b string, amount int64, ref string, md map[string]string) ledger.Command {
	tb.Helper()
	c := f.Transfer(tb, a, b, amount)
	c.Reference, c.Metadata = ref, md
	return c
}

// inUse fails unless r refused its request for a reference that transfer
// holder holds, naming it.
func inUse(tb testing.TB, what string, r ledger.Result, holder string) {
	tb.Helper()
	refused(tb, what, r, ledger.CodeReferenceInUse)
	if r.Err.Existing != holder {
		tb.Fatalf("%s: names %q (%s), want the first transfer %s", what, r.Err.Existing, r.Err.Message, holder)
	}
}

// TestReferences holds a client's reference to one transfer in a region:
// a second request with it under another key is refused naming the first,
// in another batch or the same one, and its repeat names it again; a
// transfer refused (insufficient funds) frees its reference; another
// client's equal reference is its own. The metadata is kept and selects
// transfers by containment, and the reference selects its transfer.
func TestReferences(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)

	md := map[string]string{"order": "o-1", "shop": "north"}
	first := f.MustApply(t, referenced(t, f, a, b, 10, "order-1", md)).Transfer
	if first.Reference != "order-1" || !reflect.DeepEqual(first.Metadata, md) {
		t.Fatalf("first: %+v, want the reference and metadata", first)
	}
	second := referenced(t, f, a, b, 10, "order-1", nil)
	inUse(t, "the reference under another key", f.Apply(t, second)[0], first.ID)
	if r := f.Apply(t, second)[0]; r.Kind != ledger.Duplicate || r.Err == nil || r.Err.Existing != first.ID {
		t.Fatalf("the refused request again: %+v, want a duplicate that names %s", r, first.ID)
	}

	// One batch: the first of two with one reference takes it.
	x, y := referenced(t, f, a, b, 1, "order-2", nil), referenced(t, f, a, b, 1, "order-2", nil)
	rs := f.Apply(t, x, y)
	if rs[0].Kind != ledger.Applied {
		t.Fatalf("the first in the batch: %v %v", rs[0].Kind, rs[0].Err)
	}
	inUse(t, "the second in the batch", rs[1], x.TransferID)

	// A refused transfer frees its reference, in its batch and after.
	big, next := referenced(t, f, a, b, 1000, "order-3", nil), referenced(t, f, a, b, 5, "order-3", nil)
	rs = f.Apply(t, big, next)
	refused(t, "a transfer over the funds", rs[0], ledger.CodeInsufficientFunds)
	if rs[1].Kind != ledger.Applied {
		t.Fatalf("the reference of a refused transfer, in its batch: %v %v", rs[1].Kind, rs[1].Err)
	}
	refused(t, "another over the funds", f.Apply(t, referenced(t, f, a, b, 1000, "order-4", nil))[0], ledger.CodeInsufficientFunds)
	f.MustApply(t, referenced(t, f, a, b, 5, "order-4", nil))

	// Another client's equal reference is its own.
	c, _, err := f.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c2", Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	f.MustApply(t, ledger.Command{Type: ledger.TypeFund, TransferID: f.ID(t), ClientID: "c2", IdempotencyKey: "fund",
		To: c.ID, Amount: 10, Currency: "EUR", CreatedAt: f.Clock.Now(), Reference: "order-1"})

	// The lists select by reference and by metadata.
	got, err := f.Store.TransfersPage(ctx, ledger.TransferFilter{ClientID: "c1", Reference: "order-1"}, 10)
	if err != nil || len(got) != 2 || got[0].Status != ledger.StatusRejected || got[1].ID != first.ID {
		t.Fatalf("c1's transfers with reference order-1: %+v %v, want the refused one and the first", got, err)
	}
	f.MustApply(t, referenced(t, f, a, b, 1, "", map[string]string{"shop": "north"}))
	for _, tt := range []struct {
		md   map[string]string
		want int
	}{{map[string]string{"shop": "north"}, 2}, {md, 1}, {map[string]string{"shop": "south"}, 0}, {map[string]string{"order": "o-1", "shop": "south"}, 0}} {
		got, err := f.Store.TransfersPage(ctx, ledger.TransferFilter{ClientID: "c1", Metadata: tt.md}, 10)
		if err != nil || len(got) != tt.want {
			t.Fatalf("c1's transfers with metadata %v: %d %v, want %d", tt.md, len(got), err, tt.want)
		}
	}
	f.MustVerify(t)
}

// TestReferenceRace sends one reference under many keys at once, each
// between accounts of its own in a transaction of its own, so that no row lock
// orders them: the unique index does. Exactly one transfer takes the
// reference, and every other request is refused naming it.
func TestReferenceRace(t *testing.T) {
	f := ledgertest.New(t)
	const n = 24
	cmds := make([]ledger.Command, n)
	for i := range cmds {
		cmds[i] = referenced(t, f, f.Account(t, "EUR", 10), f.Account(t, "EUR", 0), 10, "order-race", nil)
	}
	// Every connection of the pool open first, so that the transactions
	// overlap instead of queueing behind the connects.
	var conns []*pgxpool.Conn
	for range f.Pool.Config().MaxConns {
		c, err := f.Pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	results := make([]ledger.Result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range cmds {
		wg.Go(func() {
			<-start
			rs, err := f.Store.Apply(context.Background(), cmds[i:i+1])
			if err != nil {
				t.Errorf("apply %d: %v", i, err)
				return
			}
			results[i] = rs[0]
		})
	}
	close(start)
	wg.Wait()
	var winner string
	for i, r := range results {
		if r.Kind == ledger.Applied {
			if winner != "" {
				t.Fatalf("two transfers took the reference: %s and %s", winner, r.Transfer.ID)
			}
			winner = cmds[i].TransferID
		}
	}
	if winner == "" {
		t.Fatal("no transfer took the reference")
	}
	for i, r := range results {
		if cmds[i].TransferID != winner {
			inUse(t, "a request that lost the race", r, winner)
		}
	}
	if got := f.Count(t, `SELECT count(*) FROM transfers WHERE reference = 'order-race' AND status <> 'REJECTED'`); got != 1 {
		t.Fatalf("%d transfers hold the reference, want 1", got)
	}
	f.MustVerify(t)
}

// TestAccountReferences holds a client's reference to one account in a
// region: another request with it is refused naming the account, with a
// key or without; a retry under the key that opened it finds it; the
// metadata is kept and selects accounts.
func TestAccountReferences(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	md := map[string]string{"customer": "cu-1"}
	open := func(key, ref string, md map[string]string) (ledger.Account, bool, error) {
		n := ledger.NewAccount{ClientID: "c1", Currency: "EUR", Reference: ref, Metadata: md, IdempotencyKey: key}
		if key != "" {
			n.RequestHash = []byte("request " + ref)
		}
		return f.Store.CreateAccount(ctx, n)
	}
	first, created, err := open("k1", "wallet-1", md)
	if err != nil || !created || first.Reference != "wallet-1" || !reflect.DeepEqual(first.Metadata, md) {
		t.Fatalf("open: %+v %v %v", first, created, err)
	}
	if again, created, err := open("k1", "wallet-1", md); err != nil || created || again.ID != first.ID {
		t.Fatalf("the retry under its key: %+v %v %v, want %s", again, created, err, first.ID)
	}
	for _, key := range []string{"k2", ""} {
		_, _, err := open(key, "wallet-1", nil)
		var e *ledger.Error
		if !errors.As(err, &e) || e.Code != ledger.CodeReferenceInUse || e.Existing != first.ID {
			t.Fatalf("the reference again (key %q): %v, want reference_in_use naming %s", key, err, first.ID)
		}
	}
	if _, _, err := open("", "wallet-2", map[string]string{"customer": "cu-2"}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		f    ledger.AccountFilter
		want int
	}{{ledger.AccountFilter{ClientID: "c1"}, 2}, {ledger.AccountFilter{ClientID: "c1", Metadata: md}, 1},
		{ledger.AccountFilter{ClientID: "c1", Reference: "wallet-2"}, 1}, {ledger.AccountFilter{ClientID: "c2", Metadata: md}, 0}} {
		got, err := f.Store.AccountsPage(ctx, tt.f, 10)
		if err != nil || len(got) != tt.want {
			t.Fatalf("accounts %+v: %d %v, want %d", tt.f, len(got), err, tt.want)
		}
	}
	if n := f.Count(t, `SELECT count(*) FROM accounts WHERE kind = 'customer'`); n != 2 {
		t.Fatalf("%d accounts, want 2", n)
	}
}
