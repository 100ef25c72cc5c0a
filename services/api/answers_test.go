package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
)

// TestAnswersPushed: with the keys' poll slowed to an hour, a transfer is
// still answered 201 long before the API's wait (30 s) runs out, in the
// region of its source and through another region: the ledger tells the
// waiting API process after COMMIT (the API submits straight to its
// region's ledger stream, under the deployed NATS permissions), and the
// API answers with the answer the notification carries.
func TestAnswersPushed(t *testing.T) {
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.API = func(_ string, ac *apid.Config) { ac.AnswerPoll = time.Hour }
		// A wait far longer than a loaded machine's commit: only the
		// notification answers before it ends.
		c.APIWait = 30 * time.Second
	})
	from := e.account(t, "eu", keyA, 1000)
	to := e.account(t, "eu", keyA, 0)
	for i, region := range []string{"eu", "us", "eu", "ap"} {
		began := time.Now()
		r := e.do(t, region, "POST", "/v1/transfers", keyA, "pushed-"+string(rune('a'+i)), transferJSON(from, to, 1))
		took := time.Since(began)
		if r.status != http.StatusCreated {
			t.Fatalf("transfer %d through %s: got %d %s, want 201", i, region, r.status, r.body)
		}
		if took > 15*time.Second {
			t.Fatalf("transfer %d through %s answered in %v: the ledger's notification did not wake it (the wait is 30 s)", i, region, took)
		}
	}
	if got := e.balance(t, "eu", keyA, to); got != 4 {
		t.Fatalf("destination: got %d, want 4", got)
	}
}

// TestClientCacheTTL: a client's API key, replaced by a new one, keeps
// working in the API that cached it until the cache's TTL ends, and is
// refused after; the new key works at once; a key refused once is not
// remembered as bad, so it works as soon as it is registered.
func TestClientCacheTTL(t *testing.T) {
	const ttl = 3 * time.Second
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.API = func(_ string, ac *apid.Config) { ac.ClientCacheTTL = ttl }
	})
	id := e.account(t, "eu", keyA, 0)
	const rotated = "key-a-rotated-0123456789"
	if r := e.do(t, "eu", "GET", "/v1/accounts/"+id, rotated, "", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("an unregistered key: got %d %s, want 401", r.status, r.body)
	}
	cached := time.Now()
	if r := e.do(t, "eu", "GET", "/v1/accounts/"+id, keyA, "", ""); r.status != http.StatusOK {
		t.Fatalf("the key: got %d %s, want 200", r.status, r.body)
	}
	// Revoke keyA: client a's key is now rotated, in every region.
	for _, s := range e.c.APIStores() {
		if err := s.PutClient(context.Background(), api.RegisteredClient{ID: "a", Name: "A"}, rotated); err != nil {
			t.Fatal(err)
		}
	}
	if r := e.do(t, "eu", "GET", "/v1/accounts/"+id, rotated, "", ""); r.status != http.StatusOK {
		t.Fatalf("the new key, refused before it was registered: got %d %s, want 200", r.status, r.body)
	}
	r := e.do(t, "eu", "GET", "/v1/accounts/"+id, keyA, "", "")
	if since := time.Since(cached); since < ttl-500*time.Millisecond && r.status != http.StatusOK {
		t.Fatalf("the revoked key %v after it was cached (TTL %v): got %d %s, want 200 from the cache", since, ttl, r.status, r.body)
	}
	// Another region never read it: the revocation holds there at once.
	if r := e.do(t, "us", "GET", "/v1/accounts/"+id, keyA, "", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("the revoked key in a region that had not cached it: got %d %s, want 401", r.status, r.body)
	}
	time.Sleep(time.Until(cached.Add(ttl)))
	if r := e.do(t, "eu", "GET", "/v1/accounts/"+id, keyA, "", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("the revoked key after the TTL: got %d %s, want 401", r.status, r.body)
	}
}
