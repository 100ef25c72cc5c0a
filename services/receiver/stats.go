package receiver

import (
	"sync"
	"sync/atomic"
)

// Refusal is why a delivery was refused.
type Refusal string

// The reasons a delivery is refused.
const (
	RefusedSignature Refusal = "signature" // no signature matches, or a header is missing
	RefusedTimestamp Refusal = "timestamp" // outside the tolerance window: a replay, or a clock far off
	RefusedBody      Refusal = "body"      // not an event paymesh sends, or too large
)

// Refusals lists every reason, in the order of the constants.
func Refusals() []Refusal { return []Refusal{RefusedSignature, RefusedTimestamp, RefusedBody} }

// Stats counts what a receiver did, since it started. The zero value is
// ready.
type Stats struct {
	// Applied counts events applied, Released those among them that had
	// been parked, Parked the events parked.
	Applied, Released, Parked atomic.Int64

	mu         sync.Mutex
	duplicates map[Cause]int64
	refusals   map[Refusal]int64
}

func (s *Stats) count(r Result) {
	switch r.Outcome {
	case Applied:
		s.Applied.Add(int64(r.Applied))
		s.Released.Add(int64(r.Applied - 1))
	case Parked:
		s.Parked.Add(1)
	case Duplicate:
		s.mu.Lock()
		if s.duplicates == nil {
			s.duplicates = map[Cause]int64{}
		}
		s.duplicates[r.Cause]++
		s.mu.Unlock()
	}
}

func (s *Stats) refused(r Refusal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusals == nil {
		s.refusals = map[Refusal]int64{}
	}
	s.refusals[r]++
}

// Duplicates returns the duplicates received with cause c.
func (s *Stats) Duplicates(c Cause) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.duplicates[c]
}

// Received returns the deliveries taken: each applied, parked or a
// duplicate (refusals apart).
func (s *Stats) Received() int64 {
	return s.Applied.Load() - s.Released.Load() + s.Parked.Load() + s.AllDuplicates()
}

// AllDuplicates returns the duplicates received, all causes.
func (s *Stats) AllDuplicates() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, v := range s.duplicates {
		n += v
	}
	return n
}

// Refused returns the deliveries refused for r.
func (s *Stats) Refused(r Refusal) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusals[r]
}
