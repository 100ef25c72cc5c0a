package webhookdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/webhooks"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func newStore(t *testing.T) (*ledgertest.Fixture, *webhookdb.Store) {
	t.Helper()
	f := ledgertest.New(t)
	if err := pgdb.Migrate(context.Background(), f.Pool, webhookdb.Migrations()); err != nil {
		t.Fatal(err)
	}
	return f, webhookdb.New(f.Pool)
}

func endpoint(f *ledgertest.Fixture, t *testing.T) webhooks.Endpoint {
	now := time.Now()
	return webhooks.Endpoint{ID: f.ID(t), Client: "c1", URL: "https://hooks.example.com/in", Secret: secret, CreatedAt: now, UpdatedAt: now}
}

// TestCreateUnderAKey: a retry of a create under its key finds the first
// endpoint; the key with another request is refused; a client's endpoints
// stop at MaxEndpoints.
func TestCreateUnderAKey(t *testing.T) {
	f, s := newStore(t)
	ctx := context.Background()
	first, created, err := s.Create(ctx, endpoint(f, t), "k1", []byte("h1"))
	if err != nil || !created || first.Version != 1 || first.Status != webhooks.Enabled {
		t.Fatalf("create: %+v %v %v", first, created, err)
	}
	again, created, err := s.Create(ctx, endpoint(f, t), "k1", []byte("h1"))
	if err != nil || created || again.ID != first.ID || again.Secret != first.Secret {
		t.Errorf("retry: %+v %v %v, want the first endpoint, not created", again, created, err)
	}
	if _, _, err := s.Create(ctx, endpoint(f, t), "k1", []byte("h2")); !errors.Is(err, webhookdb.ErrKeyReused) {
		t.Errorf("the key with another request: %v, want ErrKeyReused", err)
	}
	for range webhooks.MaxEndpoints - 1 {
		if _, _, err := s.Create(ctx, endpoint(f, t), "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Create(ctx, endpoint(f, t), "", nil); !errors.Is(err, webhookdb.ErrTooMany) {
		t.Errorf("endpoint %d: %v, want ErrTooMany", webhooks.MaxEndpoints+1, err)
	}
	if n := f.Count(t, `SELECT count(*) FROM webhook_endpoints`); n != webhooks.MaxEndpoints {
		t.Errorf("%d endpoints, want %d", n, webhooks.MaxEndpoints)
	}
}

// TestCopiesEndAtTheLatestVersion: copies applied late, twice or out of
// order leave the latest version; a copy naming another client never
// replaces the row.
func TestCopiesEndAtTheLatestVersion(t *testing.T) {
	f, s := newStore(t)
	ctx := context.Background()
	e := endpoint(f, t)
	v := func(n int64, url string) webhooks.Endpoint {
		c := e
		c.Version, c.URL, c.Status = n, url, webhooks.Enabled
		return c
	}
	for _, c := range []struct {
		e    webhooks.Endpoint
		want bool
	}{{v(2, "https://a.example/2"), true}, {v(1, "https://a.example/1"), false}, {v(2, "https://a.example/2"), false}, {v(3, "https://a.example/3"), true}} {
		applied, err := s.Put(ctx, c.e)
		if err != nil || applied != c.want {
			t.Errorf("put version %d: applied %v %v, want %v", c.e.Version, applied, err, c.want)
		}
	}
	other := v(9, "https://evil.example/")
	other.Client = "c2"
	if applied, err := s.Put(ctx, other); err != nil || applied {
		t.Errorf("a copy of another client's: applied %v %v", applied, err)
	}
	got, _, err := s.Endpoint(ctx, e.ID)
	if err != nil || got.Version != 3 || got.URL != "https://a.example/3" || got.Client != "c1" {
		t.Errorf("after the copies: %+v %v, want version 3 of c1", got, err)
	}
	if un, err := s.Unpushed(ctx, 10); err != nil || len(un) != 0 {
		t.Errorf("copies to push: %+v %v, want none (a copy is its home's to push)", un, err)
	}
}

// TestALeaseThatRanOutIsClaimedAgain: a sender that dies mid-batch never
// finishes; its deliveries are claimed again once the lease ends, and its
// late result, from the older claim, changes nothing.
func TestALeaseThatRanOutIsClaimedAgain(t *testing.T) {
	f, s := newStore(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	e, _, err := s.Create(ctx, endpoint(f, t), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	f.MustApply(t, f.Transfer(t, a, b, 1))
	if q, _, err := s.Enqueue(ctx, 100); err != nil || q != 2 {
		t.Fatalf("enqueue: %d %v, want created and completed", q, err)
	}
	first, err := s.Claim(ctx, e.ID, 10, 200*time.Millisecond)
	if err != nil || len(first) != 1 || first[0].Attempt != 1 {
		t.Fatalf("claim: %+v %v, want the head of the one account", first, err)
	}
	if c, err := s.Claim(ctx, e.ID, 10, time.Minute); err != nil || len(c) != 0 {
		t.Fatalf("claim while leased: %+v %v, want none", c, err)
	}
	var again []webhookdb.Claim
	for deadline := time.Now().Add(30 * time.Second); len(again) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if again, err = s.Claim(ctx, e.ID, 10, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if len(again) != 1 || again[0].Event != first[0].Event || again[0].Attempt != 2 {
		t.Fatalf("claim after the lease: %+v, want %v again as attempt 2", again, first[0].Event)
	}
	late := webhookdb.Result{Claim: first[0], At: time.Now(), StatusCode: 500, Err: "answered 500", Next: time.Now()}
	if err := s.Finish(ctx, e.ID, []webhookdb.Result{late}); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Claim(ctx, e.ID, 10, time.Minute); err != nil || len(c) != 0 {
		t.Fatalf("claim after the older claim's late result: %+v %v, want none (attempt 2 holds it)", c, err)
	}
	if err := s.Finish(ctx, e.ID, []webhookdb.Result{{Claim: again[0], At: time.Now(), StatusCode: 200}}); err != nil {
		t.Fatal(err)
	}
	ds, err := s.Deliveries(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Status != "delivered" || ds[0].Attempts != 2 {
		t.Errorf("the head after both results: %+v, want delivered by attempt 2", ds[0])
	}
	if n := f.Count(t, `SELECT count(*) FROM webhook_attempts WHERE endpoint_id = $1`, e.ID); n != 2 {
		t.Errorf("%d attempts recorded, want both", n)
	}
	// The next event is the head now; and a delivered event is queued again on request.
	if c, err := s.Claim(ctx, e.ID, 10, time.Minute); err != nil || len(c) != 1 || c[0].Event.Sequence != ds[1].Event.Sequence {
		t.Errorf("claim after delivery: %+v %v, want the next sequence", c, err)
	}
	ids, err := s.Redeliver(ctx, ds[0].Event, []string{e.ID})
	if err != nil || len(ids) != 1 {
		t.Errorf("redeliver: %v %v, want the endpoint", ids, err)
	}
	if ids, err := s.Redeliver(ctx, ledger.EventRef{Account: a, Sequence: 999}, []string{e.ID}); err != nil || len(ids) != 0 {
		t.Errorf("redeliver of an event that is not: %v %v, want none", ids, err)
	}
}

// TestPruneKeepsWhatIsPending: ended deliveries and attempts older than
// the bound are deleted; pending deliveries, however old, are kept.
func TestPruneKeepsWhatIsPending(t *testing.T) {
	f, s := newStore(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	e, _, err := s.Create(ctx, endpoint(f, t), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	f.MustApply(t, f.Transfer(t, a, b, 1))
	if _, _, err := s.Enqueue(ctx, 100); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, e.ID, 10, time.Minute)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	old := time.Now().Add(-48 * time.Hour)
	if err := s.Finish(ctx, e.ID, []webhookdb.Result{{Claim: c[0], At: old, StatusCode: 200}}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Prune(ctx, time.Now().Add(-24*time.Hour), 1)
	if err != nil || n != 2 {
		t.Errorf("pruned %d rows (%v), want the delivered delivery and its attempt", n, err)
	}
	ds, err := s.Deliveries(ctx, e.ID)
	if err != nil || len(ds) != 1 || ds[0].Status != "pending" {
		t.Errorf("after the prune: %+v %v, want the pending one alone", ds, err)
	}
}

// TestHeadsOnly: a claim takes only each account's head (its pending
// delivery of the lowest sequence), marked as deliveries are queued,
// finished and asked for again: the next head once one ends, the older
// one again when it is redelivered, and every account's head however many
// events queue behind them (a claim reads the heads' index, not the
// backlog).
func TestHeadsOnly(t *testing.T) {
	f, s := newStore(t)
	ctx := context.Background()
	e, _, err := s.Create(ctx, endpoint(f, t), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	const accounts = 5
	var from []string
	for range accounts {
		from = append(from, f.Account(t, "EUR", 100))
	}
	to := f.Account(t, "EUR", 0)
	for range 3 {
		for _, a := range from {
			f.MustApply(t, f.Transfer(t, a, to, 1))
		}
	}
	if _, _, err := s.Enqueue(ctx, 1000); err != nil {
		t.Fatal(err)
	}
	heads := func() map[string]int64 {
		t.Helper()
		got := map[string]int64{}
		rows, err := f.Pool.Query(ctx, `SELECT account_id, sequence FROM webhook_deliveries WHERE endpoint_id = $1 AND status = 'pending' AND head`, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var a string
			var n int64
			_ = rows.Scan(&a, &n)
			if _, twice := got[a]; twice {
				t.Errorf("account %s has two heads", a)
			}
			got[a] = n
		}
		return got
	}
	// Every account with pending deliveries has exactly its lowest as head.
	check := func(when string) {
		t.Helper()
		rows, err := f.Pool.Query(ctx, `SELECT account_id, min(sequence) FROM webhook_deliveries WHERE endpoint_id = $1 AND status = 'pending' GROUP BY 1`, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{}
		for rows.Next() {
			var a string
			var n int64
			_ = rows.Scan(&a, &n)
			want[a] = n
		}
		rows.Close()
		if got := heads(); len(got) != len(want) {
			t.Errorf("%s: heads %v, want %v", when, got, want)
		} else {
			for a, n := range want {
				if got[a] != n {
					t.Errorf("%s: account %s's head %d, want %d", when, a, got[a], n)
				}
			}
		}
	}
	check("queued")
	// The payers' accounts have their opening, funding and transfers'
	// events (a transfer's are its source's); the payee its opening alone.
	c, err := s.Claim(ctx, e.ID, 100, time.Minute)
	if err != nil || len(c) != accounts+1 {
		t.Fatalf("claim: %d claims %v, want one per account (%d)", len(c), err, accounts+1)
	}
	var rs []webhookdb.Result
	for _, cl := range c {
		rs = append(rs, webhookdb.Result{Claim: cl, At: time.Now(), StatusCode: 200})
	}
	if err := s.Finish(ctx, e.ID, rs); err != nil {
		t.Fatal(err)
	}
	check("finished")
	next, err := s.Claim(ctx, e.ID, 100, time.Minute)
	if err != nil || len(next) != accounts {
		t.Fatalf("claim after the first heads ended: %d %v, want the payers' seconds", len(next), err)
	}
	for _, n := range next {
		if n.Event.Sequence != 2 {
			t.Errorf("claim after the first heads ended: %v, want each account's second", n.Event)
		}
	}
	// An ended first event asked for again is its account's head again,
	// behind the second one in flight, which finishes as before.
	if _, err := s.Redeliver(ctx, c[0].Event, []string{e.ID}); err != nil {
		t.Fatal(err)
	}
	check("redelivered")
	again, err := s.Claim(ctx, e.ID, 100, time.Minute)
	if err != nil || len(again) != 1 || again[0].Event != c[0].Event {
		t.Fatalf("claim after the redelivery: %+v %v, want the redelivered event alone", again, err)
	}
	var rest []webhookdb.Result
	for _, cl := range append(next, again...) {
		rest = append(rest, webhookdb.Result{Claim: cl, At: time.Now(), StatusCode: 200})
	}
	if err := s.Finish(ctx, e.ID, rest); err != nil {
		t.Fatal(err)
	}
	check("both finished")
	if got := heads(); got[c[0].Event.Account] != 3 {
		t.Errorf("heads after both: %v, want %s at its third", got, c[0].Event.Account)
	}
}
