package api_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/jsfault"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
)

// ledgerGate holds every ledger's deliveries before they apply while it is
// closed, so that a request stays in flight. (Before COMMIT would not do
// for the claimed path: the held transaction locks the key's row, and a
// repeat would wait for it.)
type ledgerGate struct {
	closed atomic.Bool
	waits  atomic.Int64 // deliveries held since the gate closed
	mu     sync.Mutex
	open   chan struct{}
}

func newLedgerGate() *ledgerGate { return &ledgerGate{open: make(chan struct{})} }

func (g *ledgerGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = make(chan struct{})
	g.waits.Store(0)
	g.closed.Store(true)
}

func (g *ledgerGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.CompareAndSwap(true, false) {
		close(g.open)
	}
}

// wrap decorates a ledger's JetStream handle (ledgerd.Config's
// WrapJetStream) so that its consumers' deliveries wait at the gate.
func (g *ledgerGate) wrap(js jetstream.JetStream) jetstream.JetStream {
	return jsfault.Wrap(js, nil, g.deliver)
}

// deliver holds m while the gate is closed (a minute at most, so that a
// test that forgot to release it still ends).
func (g *ledgerGate) deliver(m jetstream.Msg) jetstream.Msg {
	if !g.closed.Load() {
		return m
	}
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	g.waits.Add(1)
	select {
	case <-open:
	case <-time.After(time.Minute):
	}
	return m
}

// held waits until a delivery waits at the closed gate: the request that
// made it is in flight.
func (g *ledgerGate) held(t testing.TB) {
	t.Helper()
	waitFor(t, "a ledger delivery held at the gate", func() bool { return g.waits.Load() > 0 })
}

// waitFor polls cond until it holds, for at most a minute (a loaded
// machine is slow), and fails the test naming what did not happen.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// gate holds a request in flight while it is closed; held waits until it
// holds one.
type gate interface {
	close()
	release()
	held(t testing.TB)
}

// rowGate holds, while it is closed, a lock on an account's row in a
// transaction of its own: a transaction applying a transfer of the
// account waits for it, having claimed the request's consume-log key (and
// on the apply-here path its key lock) but before it writes anything else.
// It holds the API's own transactions, which no ledger hook sees.
type rowGate struct {
	t       testing.TB
	pool    *pgxpool.Pool
	account string
	mu      sync.Mutex
	tx      pgx.Tx
}

func (g *rowGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	tx, err := g.pool.Begin(context.Background())
	if err != nil {
		g.t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, g.account); err != nil {
		g.t.Fatal(err)
	}
	g.tx = tx
}

// held waits until a transaction of the database waits for a lock: the
// request's, behind the gate's row lock.
func (g *rowGate) held(t testing.TB) {
	t.Helper()
	waitFor(t, "a transaction waiting for the account's row", func() bool {
		var n int
		err := g.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n > 0
	})
}

func (g *rowGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tx != nil {
		_ = g.tx.Rollback(context.Background())
		g.tx = nil
	}
}

// The ways a transfer request reaches the ledger's transaction.
var keyPaths = []struct {
	name string
	// claim: --claim-keys; submitAll: --submit-all; neither: applied here
	claim, submitAll bool
}{
	{name: "applied-here"},
	{name: "submitted", submitAll: true},
	{name: "claimed", claim: true},
}

// TestKeyGuaranteesBothPaths runs the idempotency guarantees on both ways
// a transfer request reaches the ledger: unclaimed (the accounts are known
// to the API process, which opened them: the ledger's transaction stores
// the key with the answer) and claimed (--claim-keys: the key is claimed
// in a commit of its own first). On each: the first answer is stored with
// the key, in the transaction of the debit; a repeat gets it byte for byte
// with Idempotent-Replayed; another body gets 422; while the first is in
// flight a repeat gets 409 with Retry-After and another body 422; an answer
// the API gave when its wait ran out (202) is the one stored, and the
// ledger's later commit does not replace it; every transfer is applied
// once.
func TestKeyGuaranteesBothPaths(t *testing.T) {
	for _, path := range keyPaths {
		t.Run(path.name, func(t *testing.T) {
			ledgerGate := newLedgerGate()
			t.Cleanup(ledgerGate.release)
			e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
				c.Ledger = func(_ string, lc *ledgerd.Config) { lc.WrapJetStream = ledgerGate.wrap }
				c.API = func(_ string, ac *apid.Config) { ac.ClaimKeys, ac.SubmitAll = path.claim, path.submitAll }
			})
			from := e.account(t, "eu", keyA, 1000)
			to := e.account(t, "eu", keyA, 0)
			h := e.c.Region("eu").API
			store := e.c.Region("eu").APIStore
			ctx := context.Background()
			var gate gate = ledgerGate
			if !path.claim && !path.submitAll {
				gate = &rowGate{t: t, pool: e.c.Region("eu").Ledger.Store.Pool(), account: from}
				t.Cleanup(gate.release)
			}

			first := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k1", transferJSON(from, to, 10))
			if first.status != http.StatusCreated {
				t.Fatalf("first: %d %s", first.status, first.body)
			}
			wantUnclaimed, wantDirect := int64(1), int64(1)
			switch {
			case path.claim:
				wantUnclaimed, wantDirect = 0, 0
			case path.submitAll:
				wantDirect = 0
			}
			if n, d := h.Stats.Unclaimed.Load(), h.Stats.Direct.Load(); n != wantUnclaimed || d != wantDirect {
				t.Fatalf("%d requests went unclaimed and %d were applied here, want %d and %d", n, d, wantUnclaimed, wantDirect)
			}
			var tb api.TransferBody
			first.json(t, &tb)
			k, ok, err := store.Key(ctx, "a", "k1")
			if err != nil || !ok || k.InFlight || !k.Final || k.TransferID != tb.ID || !bytes.Equal(k.Body, first.body) || len(k.Fingerprint) == 0 {
				t.Fatalf("stored key: %+v %v %v, want the first answer for %s", k, ok, err, tb.ID)
			}
			again := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k1", transferJSON(from, to, 10))
			if again.status != first.status || !bytes.Equal(again.body, first.body) || again.header.Get(api.HeaderReplayed) != "true" {
				t.Fatalf("repeat: %d %s (replayed %q), want the first answer replayed", again.status, again.body, again.header.Get(api.HeaderReplayed))
			}
			if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k1", transferJSON(from, to, 11)); r.status != 422 || r.code(t) != "idempotency_key_reused" {
				t.Fatalf("another body: %d %s, want 422 idempotency_key_reused", r.status, r.body)
			}

			// In flight: the ledger holds its commit.
			gate.close()
			done := make(chan response, 1)
			go func() { done <- e.do(t, "eu", "POST", "/v1/transfers", keyA, "k2", transferJSON(from, to, 20)) }()
			gate.held(t)
			if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k2", transferJSON(from, to, 20)); r.status != http.StatusConflict ||
				r.code(t) != api.CodeIdempotencyKeyInFlight || r.header.Get("Retry-After") == "" {
				t.Fatalf("repeat in flight: %d %s (Retry-After %q), want 409", r.status, r.body, r.header.Get("Retry-After"))
			}
			if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k2", transferJSON(from, to, 21)); r.status != 422 || r.code(t) != "idempotency_key_reused" {
				t.Fatalf("another body in flight: %d %s, want 422", r.status, r.body)
			}
			gate.release()
			second := <-done
			if second.status != http.StatusCreated {
				t.Fatalf("the request held in flight: %d %s", second.status, second.body)
			}
			if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k2", transferJSON(from, to, 20)); !bytes.Equal(r.body, second.body) {
				t.Fatalf("repeat after: %d %s, want %s", r.status, r.body, second.body)
			}

			// The wait (3 s) runs out before the ledger commits: 202, stored.
			gate.close()
			slow := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k3", transferJSON(from, to, 30))
			if slow.status != http.StatusAccepted {
				gate.release()
				t.Fatalf("held past the wait: %d %s, want 202", slow.status, slow.body)
			}
			gate.release()
			e.quiet(t)
			if k, _, _ := store.Key(ctx, "a", "k3"); k.Status != http.StatusAccepted || !bytes.Equal(k.Body, slow.body) {
				t.Fatalf("key after the ledger committed: %d %s, want the 202 the client got", k.Status, k.Body)
			}
			if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k3", transferJSON(from, to, 30)); r.status != http.StatusAccepted || !bytes.Equal(r.body, slow.body) {
				t.Fatalf("repeat of the 202: %d %s, want %s", r.status, r.body, slow.body)
			}
			if got := e.balance(t, "eu", keyA, to); got != 60 {
				t.Fatalf("destination: got %d, want 60 (each transfer once)", got)
			}
		})
	}
}

// TestUnclaimedAcrossProcesses: two API processes of one region, each
// vouching for the accounts. A request in flight in the first is unknown to
// the second's own tables: the second's submit is recognised by the ledger
// stream's Msg-Id window, and with no key row yet it answers 409 (for
// another body too: the documented difference from the claimed path);
// once the first is answered, the second replays the stored answer, and
// another body gets 422. One transfer.
func TestUnclaimedAcrossProcesses(t *testing.T) {
	for _, c := range []struct {
		name                  string
		submitAll, secondHere bool
	}{
		{name: "applied-here"},
		{name: "both-applied-here", secondHere: true},
		{name: "submitted", submitAll: true},
	} {
		t.Run(c.name, func(t *testing.T) { unclaimedAcrossProcesses(t, c.submitAll, c.secondHere) })
	}
}

// secondAPI opens another API process of region eu, on node 3, as the
// cluster's own is opened; with submitAll it submits every request.
func secondAPI(t *testing.T, e *env, wait time.Duration, submitAll bool) *apid.Server {
	t.Helper()
	u, err := natsauth.UserOf("eu", natsauth.API)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := apid.Open(context.Background(), apid.Config{Region: "eu", Regions: e.c.IDs(), Node: 3,
		PostgresURL: e.c.Region("eu").URL, NATSURL: e.topo.ClientURL("eu"), NATSUser: u.Name, NATSPassword: u.Password,
		Shards: 4, AckWait: 2 * time.Second, Wait: wait, SubmitAll: submitAll, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = srv.Close() })
	return srv
}

func unclaimedAcrossProcesses(t *testing.T, submitAll, secondHere bool) {
	ledgerGate := newLedgerGate()
	t.Cleanup(ledgerGate.release)
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.Ledger = func(_ string, lc *ledgerd.Config) { lc.WrapJetStream = ledgerGate.wrap }
		c.API = func(_ string, ac *apid.Config) { ac.SubmitAll = submitAll }
		// Applied here, the second process answers each repeat when its
		// wait (1 s) runs out: two of them fit in the first's wait.
		c.APIWait = 6 * time.Second
	})
	from := e.account(t, "eu", keyA, 1000)
	to := e.account(t, "eu", keyA, 0)
	reg := e.c.Region("eu")
	var gate gate = ledgerGate
	if !submitAll {
		// The first process applies the request itself; the second only
		// submits: its repeat is refused by the first's key lock.
		gate = &rowGate{t: t, pool: reg.Ledger.Store.Pool(), account: from}
		t.Cleanup(gate.release)
	}
	gen, err := idgen.NewGenerator(e.c.IDs(), "eu", 950)
	if err != nil {
		t.Fatal(err)
	}
	var second *api.Handler
	var base string
	if secondHere {
		s := secondAPI(t, e, time.Second, false)
		second, base = s.API(), s.URL()
	} else {
		second = api.New(api.Config{Region: "eu", Regions: e.c.IDs(), IDs: gen, Ledger: reg.Ledger.Store, Store: reg.APIStore,
			Router: reg.Router, Wait: time.Second})
		srv := httptest.NewServer(second)
		t.Cleanup(srv.Close)
		base = srv.URL
	}
	// The second process has not seen the accounts: it reads them
	// (CheckAccounts), and submits unclaimed.
	if r := postTransfer(t, base, "teach", transferJSON(from, to, 1)); r.status != http.StatusCreated {
		t.Fatalf("first transfer through the second process: %d %s", r.status, r.body)
	}
	if n := second.Stats.Unclaimed.Load(); n != 1 {
		t.Fatalf("the second process sent %d unclaimed, want 1", n)
	}

	gate.close()
	done := make(chan response, 1)
	go func() { done <- postTransfer(t, reg.APIURL, "k", transferJSON(from, to, 5)) }()
	gate.held(t)
	for i, body := range []string{transferJSON(from, to, 5), transferJSON(from, to, 6)} {
		status, code := http.StatusConflict, api.CodeIdempotencyKeyInFlight
		if i == 1 && secondHere {
			// The second process's own repeat still waits for its
			// transaction there (behind the first's): another body is 422.
			status, code = http.StatusUnprocessableEntity, "idempotency_key_reused"
		}
		if r := postTransfer(t, base, "k", body); r.status != status || r.code(t) != code {
			gate.release()
			t.Fatalf("in flight in the other process (%s): %d %s, want %d %s", body, r.status, r.body, status, code)
		}
	}
	want := int64(3)
	if secondHere {
		want = 2 // the second repeat was answered from the process's own table
	}
	if n := second.Stats.Unclaimed.Load(); n != want {
		t.Fatalf("the second process sent %d unclaimed, want %d", n, want)
	}
	gate.release()
	first := <-done
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	// Both applied here, the second process's own repeat is still in flight
	// there until its transaction, held behind the first's, has found the
	// key applied: 409 until then.
	r := postTransfer(t, base, "k", transferJSON(from, to, 5))
	for deadline := time.Now().Add(10 * time.Second); secondHere && r.status == http.StatusConflict && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		r = postTransfer(t, base, "k", transferJSON(from, to, 5))
	}
	if r.status != first.status || !bytes.Equal(r.body, first.body) || r.header.Get(api.HeaderReplayed) != "true" {
		t.Fatalf("repeat in the other process: %d %s, want the first answer replayed", r.status, r.body)
	}
	if r := postTransfer(t, base, "k", transferJSON(from, to, 6)); r.status != 422 || r.code(t) != "idempotency_key_reused" {
		t.Fatalf("another body in the other process: %d %s, want 422", r.status, r.body)
	}
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, to); got != 6 {
		t.Fatalf("destination: got %d, want 6 (the teaching transfer and one of key k)", got)
	}
}
