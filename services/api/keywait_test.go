package api

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// TestKeyWaiter: requests waiting for their keys are woken, with the
// answered key, once it is answered; one that stopped waiting hears
// nothing; and the poller stops when nobody waits.
func TestKeyWaiter(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	now := f.Clock.Now()
	w := &keyWaiter{store: f.Store}
	const n = 20
	chans := make([]<-chan postgres.IdempotencyKey, n)
	stops := make([]func(), n)
	for i := range n {
		key := fmt.Sprint("k", i)
		if _, _, err := f.Store.BeginKey(ctx, "c1", key, []byte("fp"), fmt.Sprint("eu-t", i), now, time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
		chans[i], stops[i] = w.done("c1", key)
	}
	// The last one stops waiting before its key is answered.
	stops[n-1]()
	for i := range n {
		if _, err := f.Store.Answer(ctx, "c1", fmt.Sprint("k", i), http.StatusCreated, []byte("{}"), false); err != nil {
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
	for {
		w.mu.Lock()
		idle := !w.polling && len(w.wait) == 0
		w.mu.Unlock()
		if idle {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the poller still runs with nobody waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
