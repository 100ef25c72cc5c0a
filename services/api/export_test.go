package api

import (
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// KeyWaiter exposes the key waiter to the external tests.
type KeyWaiter = keyWaiter

// NewKeyWaiter returns a key waiter over store that reads every waited-for
// key every poll.
func NewKeyWaiter(store Store, poll time.Duration) *KeyWaiter {
	return &keyWaiter{store: store, poll: poll}
}

// Done returns a channel that receives the key once it is answered, and
// the cancel that stops waiting (keyWaiter.done).
func (w *keyWaiter) Done(client, key string) (<-chan IdempotencyKey, func()) {
	return w.done(client, key)
}

// Idle reports whether nobody waits and the poller stopped.
func (w *keyWaiter) Idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.reading && len(w.wait) == 0
}

// Answered tells the waiter that the ledger answered client's key, without
// the answer (keyWaiter.answered).
func (w *keyWaiter) Answered(client, key string) {
	w.answered([]IdempotencyKey{{ClientID: client, Key: key}})
}

// AnsweredWith tells the waiter that the ledger answered client's key with
// status and body.
func (w *keyWaiter) AnsweredWith(client, key string, status int, body []byte) {
	w.answered([]IdempotencyKey{{ClientID: client, Key: key, Status: status, Body: body, Final: status != 202}})
}

// EntriesPage exposes the paging of an account's entries (entriesPage).
func EntriesPage(ps []ledger.Posting, limit int) EntriesBody { return entriesPage(ps, limit) }
