package ledger

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Stats counts what a ledger did: outcomes, duplicates by the layer that
// caught them, and the guards that fired. It is safe for concurrent use; the
// zero value is ready.
type Stats struct {
	Deliveries         atomic.Int64 // messages delivered, redeliveries included
	Applied            atomic.Int64
	Rejected           atomic.Int64
	Conflicts          atomic.Int64
	InProgress         atomic.Int64
	Parked             atomic.Int64 // saga steps that arrived before the state they need
	Invalid            atomic.Int64
	DeadLettered       atomic.Int64
	Redeliveries       atomic.Int64
	Retries            atomic.Int64 // transaction attempts retried
	ApplyFailed        atomic.Int64 // applies that failed, their messages left for redelivery
	GaveUp             atomic.Int64 // transactions abandoned on a retryable error: the retry budget spent (any store transaction)
	Fenced             atomic.Int64 // commits refused because a claim was fenced off
	IllegalTransitions atomic.Int64
	StaleVersions      atomic.Int64
	// CommitsUnanswered counts COMMITs the server never answered (the
	// connection died mid-COMMIT) in the transactions whose outcome can be
	// read back: apply batches (their consume-log rows) and new
	// idempotency keys (the key's row).
	CommitsUnanswered atomic.Int64

	mu   sync.Mutex
	dups map[string]int64
}

// Duplicate counts one duplicate caught by layer.
func (s *Stats) Duplicate(layer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dups == nil {
		s.dups = map[string]int64{}
	}
	s.dups[layer]++
}

// Duplicates returns the duplicates caught so far, by layer.
func (s *Stats) Duplicates() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.dups)
}

// Record counts one result.
func (s *Stats) Record(r Result) {
	switch r.Kind {
	case Applied:
		s.Applied.Add(1)
	case Rejected:
		s.Rejected.Add(1)
	case Duplicate:
		s.Duplicate(r.Layer)
	case InProgress:
		s.InProgress.Add(1)
	case Conflict:
		s.Conflicts.Add(1)
	case Invalid:
		s.Invalid.Add(1)
	case Parked:
		s.Parked.Add(1)
	}
}
