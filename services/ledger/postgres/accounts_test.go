package postgres_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// repeating is an ID source that first hands out IDs minted before, as a
// node whose clock was stepped back repeats its IDs, then its source's.
type repeating struct {
	postgres.IDSource
	mu    sync.Mutex
	again []string
}

func (r *repeating) NextString() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.again) > 0 {
		id := r.again[0]
		r.again = r.again[1:]
		return id, nil
	}
	return r.IDSource.NextString()
}

// TestAccountIDCollision: an ID minted for a new account that an account
// of another client, currency or floor, or one already used, has is not
// handed out: the collision is counted and a new ID minted, and the
// account under the taken ID is left as it was.
func TestAccountIDCollision(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	taken := f.Account(t, "EUR", 0) // of client c1, floor 0, untouched
	used := f.Account(t, "EUR", 50) // of client c1, funded
	tests := []struct {
		name  string
		taken string
		n     ledger.NewAccount
	}{
		{"OtherClient", taken, ledger.NewAccount{ClientID: "c2", Currency: "EUR"}},
		{"OtherCurrency", taken, ledger.NewAccount{ClientID: "c1", Currency: "USD"}},
		{"OtherFloor", taken, ledger.NewAccount{ClientID: "c1", Currency: "EUR", Floor: -10}},
		{"Used", used, ledger.NewAccount{ClientID: "c1", Currency: "EUR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := f.Store.Account(ctx, tt.taken)
			if err != nil {
				t.Fatal(err)
			}
			st := &ledger.Stats{}
			store := postgres.New(f.Pool, postgres.Config{Region: "eu", Regions: f.Regions, Stats: st,
				IDs: &repeating{IDSource: f.IDs, again: []string{tt.taken}}})
			a, err := store.CreateAccount(ctx, tt.n)
			if err != nil {
				t.Fatalf("create %+v: %v", tt.n, err)
			}
			if a.ID == tt.taken || a.ClientID != tt.n.ClientID || a.Currency != tt.n.Currency || a.Floor != tt.n.Floor ||
				a.Kind != ledger.KindCustomer || a.Balance != 0 || a.Version != 0 {
				t.Fatalf("got %+v, want a new account of %+v under an ID other than %s", a, tt.n, tt.taken)
			}
			if n := st.AccountIDCollisions.Load(); n != 1 {
				t.Fatalf("collisions: got %d, want 1", n)
			}
			if after, err := f.Store.Account(ctx, tt.taken); err != nil || after != before {
				t.Fatalf("the account under the taken ID: got %+v %v, want it unchanged %+v", after, err, before)
			}
		})
	}
	t.Run("ErrEveryIDTaken", func(t *testing.T) {
		st := &ledger.Stats{}
		// The issuance and transit accounts' IDs, minted with the first,
		// are taken too (they exist for EUR already).
		again := make([]string, postgres.MaxIDTries+2)
		for i := range again {
			again[i] = taken
		}
		store := postgres.New(f.Pool, postgres.Config{Region: "eu", Regions: f.Regions, Stats: st, IDs: &repeating{IDSource: f.IDs, again: again}})
		a, err := store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c3", Currency: "EUR"})
		if err == nil || ledger.ErrorCode(err) != "" || !strings.Contains(err.Error(), taken) {
			t.Fatalf("got %+v %v, want an internal error naming %s", a, err, taken)
		}
		if n := st.AccountIDCollisions.Load(); n != postgres.MaxIDTries {
			t.Fatalf("collisions: got %d, want %d", n, postgres.MaxIDTries)
		}
		if n := f.Count(t, `SELECT count(*) FROM accounts WHERE client_id = 'c3'`); n != 0 {
			t.Fatalf("accounts of c3: got %d, want none", n)
		}
	})
	f.MustVerify(t)
}

// TestCreateAccountCommitLost cuts the connection while the COMMIT of a
// new account is in flight. When the server committed, the account is
// read back and recognised as the one created (ours); when it did not,
// the creation is rerun. Either way: one account, the client's own, and no
// collision.
func TestCreateAccountCommitLost(t *testing.T) {
	for name, mode := range map[string]faultproxy.Mode{"CommittedThenCut": faultproxy.DropAfter, "CutBeforeCommit": faultproxy.DropBefore} {
		t.Run(name, func(t *testing.T) {
			f, proxy := proxiedFixture(t)
			proxy.Trap([]byte("commit"), mode)
			a, err := f.Store.CreateAccount(context.Background(), ledger.NewAccount{ClientID: "c7", Currency: "EUR", Floor: -5})
			if err != nil {
				t.Fatal(err)
			}
			if proxy.Fired() != 1 {
				t.Fatalf("the fault fired %d times, want once", proxy.Fired())
			}
			if a.ClientID != "c7" || a.Currency != "EUR" || a.Floor != -5 {
				t.Fatalf("got %+v, want c7's EUR account with floor -5", a)
			}
			if n := f.Count(t, `SELECT count(*) FROM accounts WHERE client_id = 'c7'`); n != 1 {
				t.Fatalf("accounts of c7: got %d, want 1", n)
			}
			if n := f.Stats.AccountIDCollisions.Load(); n != 0 {
				t.Fatalf("collisions: got %d, want 0", n)
			}
			if n := f.Stats.CommitsUnanswered.Load(); n != 1 {
				t.Fatalf("commits unanswered: got %d, want 1", n)
			}
		})
	}
}
