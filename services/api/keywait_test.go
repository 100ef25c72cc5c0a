package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/services/api"
	apipg "github.com/paymesh/paymesh/services/api/postgres"
)

// TestKeyWaiter: requests waiting for their keys are woken, with the
// answered key, once it is answered; one that stopped waiting hears
// nothing; and the poller stops when nobody waits.
func TestKeyWaiter(t *testing.T) {
	pool, _ := pgtest.MustDatabase(t, apipg.Migrations())
	store := apipg.New(pool)
	ctx := context.Background()
	now := time.Now()
	w := api.NewKeyWaiter(store)
	const n = 20
	chans := make([]<-chan api.IdempotencyKey, n)
	stops := make([]func(), n)
	for i := range n {
		key := fmt.Sprint("k", i)
		claim := api.KeyClaim{Client: "c1", Key: key, Fingerprint: []byte("fp"), TransferID: fmt.Sprint("eu-t", i), Now: now, Lease: time.Minute, TTL: time.Hour}
		if _, _, err := store.BeginKey(ctx, claim); err != nil {
			t.Fatal(err)
		}
		chans[i], stops[i] = w.Done("c1", key)
	}
	// The last one stops waiting before its key is answered.
	stops[n-1]()
	for i := range n {
		if _, err := store.Answer(ctx, "c1", fmt.Sprint("k", i), http.StatusCreated, []byte("{}"), false); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n - 1 {
		select {
		case k := <-chans[i]:
			if k.Key != fmt.Sprint("k", i) || k.InFlight || k.Status != http.StatusCreated {
				t.Fatalf("waiter %d got %+v", i, k)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d was not woken", i)
		}
		stops[i]()
	}
	select {
	case k := <-chans[n-1]:
		t.Fatalf("a waiter that stopped waiting got %+v", k)
	case <-time.After(100 * time.Millisecond): // twenty polls
	}
	deadline := time.Now().Add(5 * time.Second)
	for !w.Idle() {
		if time.Now().After(deadline) {
			t.Fatal("the poller still runs with nobody waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
