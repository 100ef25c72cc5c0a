package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
)

// TestKeyWaiter: requests waiting for their keys are woken, with the
// answered key, once it is answered; one that stopped waiting hears
// nothing; and the poller stops when nobody waits.
func TestKeyWaiter(t *testing.T) {
	pool, _ := pgtest.MustDatabase(t, apidb.Migrations())
	store := apidb.New(pool)
	ctx := context.Background()
	now := time.Now()
	w := api.NewKeyWaiter(store, 5*time.Millisecond)
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

// TestKeyWaiterTold: with the poll at an hour, a key the ledger says it
// answered is read and its waiter woken at once; a key answered but not
// told of is not (only the poll would read it); a key told of while still
// in flight keeps its waiter waiting.
func TestKeyWaiterTold(t *testing.T) {
	pool, _ := pgtest.MustDatabase(t, apidb.Migrations())
	store := apidb.New(pool)
	ctx := context.Background()
	now := time.Now()
	w := api.NewKeyWaiter(store, time.Hour)
	chans := map[string]<-chan api.IdempotencyKey{}
	for _, key := range []string{"told", "untold", "inflight"} {
		claim := api.KeyClaim{Client: "c1", Key: key, Fingerprint: []byte("fp"), TransferID: "eu-" + key, Now: now, Lease: time.Minute, TTL: time.Hour}
		if _, _, err := store.BeginKey(ctx, claim); err != nil {
			t.Fatal(err)
		}
		ch, stop := w.Done("c1", key)
		defer stop()
		chans[key] = ch
	}
	for _, key := range []string{"told", "untold"} {
		if _, err := store.Answer(ctx, "c1", key, http.StatusCreated, []byte("{}"), false); err != nil {
			t.Fatal(err)
		}
	}
	w.Answered("c1", "told")
	w.Answered("c1", "inflight")
	w.Answered("c2", "told") // another client's key: nobody waits for it
	select {
	case k := <-chans["told"]:
		if k.Key != "told" || k.InFlight || k.Status != http.StatusCreated {
			t.Fatalf("told: got %+v", k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("told: the waiter was not woken")
	}
	select {
	case k := <-chans["untold"]:
		t.Fatalf("untold: woken with %+v without a notification or a poll", k)
	case k := <-chans["inflight"]:
		t.Fatalf("inflight: woken with %+v while in flight", k)
	case <-time.After(300 * time.Millisecond):
	}
	w.Answered("c1", "untold")
	select {
	case <-chans["untold"]:
	case <-time.After(10 * time.Second):
		t.Fatal("untold: not woken once told")
	}
}

// TestKeyWaiterToldTheAnswer: a notification that carries the answer its
// batch stored wakes the key's waiters with that answer at once, without
// reading the key (here it is still in flight in the database, so a read
// would keep them waiting), and the waiter stops.
func TestKeyWaiterToldTheAnswer(t *testing.T) {
	pool, _ := pgtest.MustDatabase(t, apidb.Migrations())
	store := apidb.New(pool)
	ctx := context.Background()
	now := time.Now()
	w := api.NewKeyWaiter(store, time.Hour)
	claim := api.KeyClaim{Client: "c1", Key: "k", Fingerprint: []byte("fp"), TransferID: "eu-k", Now: now, Lease: time.Minute, TTL: time.Hour}
	if _, _, err := store.BeginKey(ctx, claim); err != nil {
		t.Fatal(err)
	}
	first, stop1 := w.Done("c1", "k")
	defer stop1()
	second, stop2 := w.Done("c1", "k")
	defer stop2()
	w.AnsweredWith("c1", "other", http.StatusCreated, []byte(`{"id":"x"}`)) // nobody waits for it
	w.AnsweredWith("c1", "k", http.StatusCreated, []byte(`{"id":"eu-k"}`))
	for i, ch := range []<-chan api.IdempotencyKey{first, second} {
		select {
		case k := <-ch:
			if k.Key != "k" || k.InFlight || !k.Final || k.Status != http.StatusCreated || string(k.Body) != `{"id":"eu-k"}` {
				t.Fatalf("waiter %d: got %+v", i, k)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d was not given the answer the notification carried", i)
		}
	}
	stop1()
	stop2()
	deadline := time.Now().Add(10 * time.Second)
	for !w.Idle() {
		if time.Now().After(deadline) {
			t.Fatal("the waiter still runs with nobody waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
