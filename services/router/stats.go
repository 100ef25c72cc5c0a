package router

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/paymesh/paymesh/services/ledger"
)

// Stats counts what a router did. The zero value is ready.
type Stats struct {
	Submitted         atomic.Int64 // commands stored in the local route stream, or in the local ledger stream (Direct)
	Direct            atomic.Int64 // of Submitted, commands homed here, stored straight in the ledger stream
	DuplicateSubmits  atomic.Int64 // submits the route stream recognised by Nats-Msg-Id
	Forwarded         atomic.Int64 // commands the home region acked
	ForwardRetries    atomic.Int64 // forwards that failed and will be retried
	ForwardDuplicates atomic.Int64 // forwards the home stream recognised by Nats-Msg-Id
	Relayed           atomic.Int64 // outbox steps the destination acked
	RelayRetries      atomic.Int64 // relays that failed and will be retried
	RelayDuplicates   atomic.Int64 // relays the destination recognised by Nats-Msg-Id
	Refused           atomic.Int64 // route-stream messages not forwarded: no client command, or no route subject

	mu     sync.Mutex
	causes map[StageCause]int64
}

// Stage is the hop of a router's publish that JetStream's Nats-Msg-Id
// window caught a duplicate at.
type Stage string

// The router's stages: a submit into the route stream (or the ledger
// stream, for a command homed here), a forward to the home region's ledger
// stream, a relay of a saga step from the outbox.
const (
	StageSubmit  Stage = "submit"
	StageForward Stage = "forward"
	StageRelay   Stage = "relay"
)

// Stages lists every stage.
var Stages = []Stage{StageSubmit, StageForward, StageRelay}

// StageCause is what a router's duplicates are counted by.
type StageCause struct {
	Stage Stage
	Cause ledger.Cause
}

// caught counts one duplicate caught at stage, sent again for cause.
func (s *Stats) caught(stage Stage, cause ledger.Cause) {
	switch stage {
	case StageSubmit:
		s.DuplicateSubmits.Add(1)
	case StageForward:
		s.ForwardDuplicates.Add(1)
	case StageRelay:
		s.RelayDuplicates.Add(1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.causes == nil {
		s.causes = map[StageCause]int64{}
	}
	s.causes[StageCause{stage, cause}]++
}

// DuplicatesByCause returns the duplicates caught so far, by stage and
// cause.
func (s *Stats) DuplicatesByCause() map[StageCause]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.causes)
}
