package api

import (
	"context"
	"sync"
	"time"
)

// keyWaiter waits for idempotency keys to be answered. The requests
// waiting for their ledger's answer do not each poll their own key: one
// goroutine, running only while someone waits, reads every waited-for key
// in one query every keyPoll, and wakes the requests whose key is answered.
type keyWaiter struct {
	store interface {
		AnsweredKeys(ctx context.Context, clients, keys []string) ([]IdempotencyKey, error)
	}
	mu   sync.Mutex
	wait map[clientKey][]chan IdempotencyKey
	// polling is set while the polling goroutine runs.
	polling bool
}

type clientKey struct{ client, key string }

// keyPoll is how often the waited-for keys are read.
const keyPoll = 5 * time.Millisecond

// done returns a channel that receives the key once it is answered (no
// longer in flight). cancel stops waiting; it must be called.
func (w *keyWaiter) done(client, key string) (ch <-chan IdempotencyKey, cancel func()) {
	c := make(chan IdempotencyKey, 1)
	k := clientKey{client, key}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wait == nil {
		w.wait = map[clientKey][]chan IdempotencyKey{}
	}
	w.wait[k] = append(w.wait[k], c)
	if !w.polling {
		w.polling = true
		go w.poll()
	}
	return c, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for i, x := range w.wait[k] {
			if x == c {
				w.wait[k] = append(w.wait[k][:i], w.wait[k][i+1:]...)
				break
			}
		}
		if len(w.wait[k]) == 0 {
			delete(w.wait, k)
		}
	}
}

// poll reads the waited-for keys every keyPoll until nobody waits. A read
// that fails is tried again at the next tick: the waiters' own deadlines
// bound their wait.
func (w *keyWaiter) poll() {
	tick := time.NewTicker(keyPoll)
	defer tick.Stop()
	for range tick.C {
		w.mu.Lock()
		if len(w.wait) == 0 {
			w.polling = false
			w.mu.Unlock()
			return
		}
		clients, keys := make([]string, 0, len(w.wait)), make([]string, 0, len(w.wait))
		for k := range w.wait {
			clients, keys = append(clients, k.client), append(keys, k.key)
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		answered, err := w.store.AnsweredKeys(ctx, clients, keys)
		cancel()
		if err != nil {
			continue
		}
		w.mu.Lock()
		for _, k := range answered {
			ck := clientKey{k.ClientID, k.Key}
			for _, c := range w.wait[ck] {
				c <- k
			}
			delete(w.wait, ck)
		}
		w.mu.Unlock()
	}
}
