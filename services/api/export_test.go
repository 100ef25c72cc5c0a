package api

// KeyWaiter exposes the key waiter to the external tests.
type KeyWaiter = keyWaiter

// NewKeyWaiter returns a key waiter over store.
func NewKeyWaiter(store Store) *KeyWaiter { return &keyWaiter{store: store} }

// Done returns a channel that receives the key once it is answered, and
// the cancel that stops waiting (keyWaiter.done).
func (w *keyWaiter) Done(client, key string) (<-chan IdempotencyKey, func()) {
	return w.done(client, key)
}

// Idle reports whether nobody waits and the poller stopped.
func (w *keyWaiter) Idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.polling && len(w.wait) == 0
}
