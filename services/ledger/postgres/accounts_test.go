package postgres_test

import (
	"context"
	"reflect"
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
			a, _, err := store.CreateAccount(ctx, tt.n)
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
			if after, err := f.Store.Account(ctx, tt.taken); err != nil || !reflect.DeepEqual(after, before) {
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
		a, _, err := store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c3", Currency: "EUR"})
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
	modes := map[string]faultproxy.Mode{"CommittedThenCut": faultproxy.DropAnswer, "CutWhileCommitting": faultproxy.DropAfter, "CutBeforeCommit": faultproxy.DropBefore}
	for name, mode := range modes {
		for _, key := range []string{"", "open-7"} {
			if key != "" {
				name += "UnderKey"
			}
			t.Run(name, func(t *testing.T) { createCommitLost(t, mode, key) })
		}
	}
}

// createCommitLost opens an account of c7, under key when it is set,
// with the COMMIT cut as mode says; under a key a retry afterwards finds
// the same account.
func createCommitLost(t *testing.T, mode faultproxy.Mode, key string) {
	f, proxy := proxiedFixture(t)
	proxy.Trap([]byte("commit"), mode)
	n := ledger.NewAccount{ClientID: "c7", Currency: "EUR", Floor: -5}
	if key != "" {
		n.IdempotencyKey, n.RequestHash = key, []byte("c7's request")
	}
	a, _, err := f.Store.CreateAccount(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if proxy.Fired() != 1 {
		t.Fatalf("the fault fired %d times, want once", proxy.Fired())
	}
	if a.ClientID != "c7" || a.Currency != "EUR" || a.Floor != -5 {
		t.Fatalf("got %+v, want c7's EUR account with floor -5", a)
	}
	if key != "" {
		f.Pool.Reset() // the cut may reach a pooled connection late
		again, created, err := f.Store.CreateAccount(context.Background(), n)
		if err != nil || created || again.ID != a.ID {
			t.Fatalf("retry under the key: %+v created %v %v, want %s, not created", again, created, err, a.ID)
		}
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
}

// TestCreateAccountUnderKey: under an idempotency key a client opens one
// account: a retry of the same request finds it (created false), however
// many run at once; another request under the key is refused
// (idempotency_key_reused) and opens nothing; another client's equal key
// and a request without a key open accounts of their own; an ID collision
// under a key is replaced as without one.
func TestCreateAccountUnderKey(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	req := ledger.NewAccount{ClientID: "c1", Currency: "EUR", Floor: -10, IdempotencyKey: "open-1", RequestHash: []byte("first request")}
	first, created, err := f.Store.CreateAccount(ctx, req)
	if err != nil || !created {
		t.Fatalf("first: %+v created %v %v, want a new account", first, created, err)
	}
	again, created, err := f.Store.CreateAccount(ctx, req)
	if err != nil || created || !reflect.DeepEqual(again, first) {
		t.Fatalf("retry: %+v created %v %v, want %+v, not created", again, created, err, first)
	}

	t.Run("Concurrent", func(t *testing.T) {
		req := req
		req.IdempotencyKey = "open-concurrent"
		const n = 16
		var wg sync.WaitGroup
		ids := make([]string, n)
		made := make([]bool, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				var a ledger.Account
				a, made[i], errs[i] = f.Store.CreateAccount(ctx, req)
				ids[i] = a.ID
			})
		}
		wg.Wait()
		createdN := 0
		for i := range n {
			if errs[i] != nil || ids[i] != ids[0] {
				t.Fatalf("request %d: %s %v, want %s", i, ids[i], errs[i], ids[0])
			}
			if made[i] {
				createdN++
			}
		}
		if createdN != 1 {
			t.Fatalf("%d of %d requests say they opened the account, want 1", createdN, n)
		}
	})
	t.Run("ErrOtherRequest", func(t *testing.T) {
		for _, other := range []ledger.NewAccount{
			{ClientID: "c1", Currency: "USD", IdempotencyKey: "open-1", RequestHash: []byte("another request")},
			{ClientID: "c1", Currency: "EUR", Floor: -10, IdempotencyKey: "open-1", RequestHash: []byte("another request")},
		} {
			a, _, err := f.Store.CreateAccount(ctx, other)
			if ledger.ErrorCode(err) != ledger.CodeIdempotencyKeyReused || !strings.Contains(err.Error(), first.ID) {
				t.Fatalf("%+v: got %+v %v, want idempotency_key_reused naming %s", other, a, err, first.ID)
			}
		}
		if n := f.Count(t, `SELECT count(*) FROM accounts WHERE client_id = 'c1' AND currency = 'USD'`); n != 0 {
			t.Fatalf("USD accounts of c1: got %d, want none", n)
		}
	})
	t.Run("OtherClientSameKey", func(t *testing.T) {
		other := req
		other.ClientID = "c2"
		a, created, err := f.Store.CreateAccount(ctx, other)
		if err != nil || !created || a.ID == first.ID || a.ClientID != "c2" {
			t.Fatalf("got %+v created %v %v, want a new account of c2", a, created, err)
		}
	})
	t.Run("NoKey", func(t *testing.T) {
		n := ledger.NewAccount{ClientID: "c1", Currency: "EUR"}
		a, created1, err1 := f.Store.CreateAccount(ctx, n)
		b, created2, err2 := f.Store.CreateAccount(ctx, n)
		if err1 != nil || err2 != nil || !created1 || !created2 || a.ID == b.ID {
			t.Fatalf("got %s %v %v and %s %v %v, want two new accounts", a.ID, created1, err1, b.ID, created2, err2)
		}
	})
	t.Run("CollisionUnderKey", func(t *testing.T) {
		st := &ledger.Stats{}
		store := postgres.New(f.Pool, postgres.Config{Region: "eu", Regions: f.Regions, Stats: st,
			IDs: &repeating{IDSource: f.IDs, again: []string{first.ID}}})
		n := ledger.NewAccount{ClientID: "c3", Currency: "EUR", IdempotencyKey: "open-1", RequestHash: []byte("c3's")}
		a, created, err := store.CreateAccount(ctx, n)
		if err != nil || !created || a.ID == first.ID || a.ClientID != "c3" || st.AccountIDCollisions.Load() != 1 {
			t.Fatalf("got %+v created %v %v (collisions %d), want a new account of c3 under another ID, one collision", a, created, err, st.AccountIDCollisions.Load())
		}
	})
	t.Run("ErrInvalid", func(t *testing.T) {
		for _, n := range []ledger.NewAccount{
			{ClientID: "c1", Currency: "EUR", IdempotencyKey: "k"},
			{ClientID: "c1", Currency: "EUR", RequestHash: []byte("h")},
			{ClientID: "c1", Currency: "EUR", IdempotencyKey: "a/b", RequestHash: []byte("h")},
		} {
			if _, _, err := f.Store.CreateAccount(ctx, n); ledger.ErrorCode(err) != ledger.CodeInvalidRequest {
				t.Errorf("%+v: got %v, want invalid_request", n, err)
			}
		}
	})
	f.MustVerify(t)
}
