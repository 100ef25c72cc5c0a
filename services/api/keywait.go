package api

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// keyWaiter waits for idempotency keys to be answered. The requests
// waiting for their ledger's answer do not each poll their own key. The
// ledger's notification after COMMIT carries the answer its batch stored
// for a key, which goes to the key's waiters at once. A key it names
// without an answer (one stored before, by a batch or a request), one
// goroutine, running only while someone waits, reads as soon as it is
// told; and it reads every waited-for key every poll interval, in case a
// notification was lost. Either way a waiter gets the answer as stored.
type keyWaiter struct {
	store interface {
		AnsweredKeys(ctx context.Context, clients, keys []string) ([]IdempotencyKey, error)
	}
	mu   sync.Mutex
	wait map[clientKey][]chan IdempotencyKey
	// told holds the waited-for keys the ledger said it answered and that
	// are not read yet; kick wakes the reader for them.
	told map[clientKey]struct{}
	kick chan struct{}
	// poll is how often every waited-for key is read, whether or not the
	// ledger said it answered it: the fallback for a lost notification.
	poll time.Duration
	// reading is set while the reading goroutine runs.
	reading bool
}

type clientKey struct{ client, key string }

// defaultAnswerPoll is keyWaiter.poll's default (Config.AnswerPoll).
const defaultAnswerPoll = 50 * time.Millisecond

// done returns a channel that receives the key once it is answered (no
// longer in flight). cancel stops waiting; it must be called. Call it
// before the request is submitted, so that no notification comes before
// the wait.
func (w *keyWaiter) done(client, key string) (ch <-chan IdempotencyKey, cancel func()) {
	c := make(chan IdempotencyKey, 1)
	k := clientKey{client, key}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wait == nil {
		w.wait, w.told, w.kick = map[clientKey][]chan IdempotencyKey{}, map[clientKey]struct{}{}, make(chan struct{}, 1)
	}
	w.wait[k] = append(w.wait[k], c)
	if !w.reading {
		w.reading = true
		go w.read()
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
			delete(w.told, k)
		}
	}
}

// answered is the ledger's word that it answered these keys: those waited
// for get the answer the notification carries (Status set), or are read at
// once. Keys nobody here waits for are ignored.
func (w *keyWaiter) answered(keys []IdempotencyKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, k := range keys {
		ck := clientKey{k.ClientID, k.Key}
		waiters, ok := w.wait[ck]
		switch {
		case !ok:
		case k.Status != 0:
			for _, c := range waiters {
				c <- k
			}
			delete(w.wait, ck)
			delete(w.told, ck)
			if len(w.wait) == 0 {
				n++ // so that the reader sees nobody waits, and stops
			}
		default:
			w.told[ck] = struct{}{}
			n++
		}
	}
	if n > 0 {
		select {
		case w.kick <- struct{}{}:
		default: // the reader is already due
		}
	}
}

// read runs until nobody waits: when kicked it reads the keys it was told
// of, and every poll interval all the waited-for keys. A read that fails is
// tried again at the next tick: the waiters' own deadlines bound their
// wait.
func (w *keyWaiter) read() {
	tick := time.NewTicker(cmp.Or(w.poll, defaultAnswerPoll))
	defer tick.Stop()
	for {
		all := false
		select {
		case <-w.kick:
		case <-tick.C:
			all = true
		}
		w.mu.Lock()
		if len(w.wait) == 0 {
			w.reading = false
			w.mu.Unlock()
			return
		}
		var clients, keys []string
		if all {
			clients, keys = make([]string, 0, len(w.wait)), make([]string, 0, len(w.wait))
			for k := range w.wait {
				clients, keys = append(clients, k.client), append(keys, k.key)
			}
		} else {
			clients, keys = make([]string, 0, len(w.told)), make([]string, 0, len(w.told))
			for k := range w.told {
				clients, keys = append(clients, k.client), append(keys, k.key)
			}
		}
		clear(w.told)
		w.mu.Unlock()
		if len(keys) == 0 {
			continue
		}
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
