package ledger

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Topic is the family of commands a message of the ledger stream carries:
// what a payments engineer reads a duplicate rate by. It is a small closed
// set, so that metrics labelled by topic stay bounded.
type Topic uint8

// Topics of the ledger stream.
const (
	// TopicUnknown is a message that did not decode into a known command.
	TopicUnknown Topic = iota
	// TopicTransfer is a client's transfer (TypeTransfer).
	TopicTransfer
	// TopicFund is a funding from the issuance account (TypeFund).
	TopicFund
	// TopicCredit is the saga step that credits a cross-region transfer's
	// destination (TypeCredit).
	TopicCredit
	// TopicConfirm is the saga step that settles a cross-region transfer at
	// its source (TypeConfirm).
	TopicConfirm
	// TopicRefund is the saga step that refunds a cross-region transfer
	// whose credit was refused (TypeRefuse).
	TopicRefund
	// TopicCapture is a client's capture of a hold (TypeCapture).
	TopicCapture
	// TopicVoid is a client's void of a hold (TypeVoid).
	TopicVoid
	// TopicExpire is the step that expires a hold (TypeExpire).
	TopicExpire
	// TopicRefundRequest is a payee's refund of a transfer (TypeRefund);
	// "refund" is the saga's own step above.
	TopicRefundRequest
	// TopicAccount is a client's close, freeze or unfreeze of an account
	// (Command.IsAccountAction).
	TopicAccount
	numTopics
)

// Topics lists every topic.
var Topics = []Topic{TopicUnknown, TopicTransfer, TopicFund, TopicCredit, TopicConfirm, TopicRefund,
	TopicCapture, TopicVoid, TopicExpire, TopicRefundRequest, TopicAccount}

// String returns the topic's label value.
func (t Topic) String() string {
	if t >= numTopics {
		t = TopicUnknown
	}
	return [...]string{"unknown", "transfer", "fund", "credit", "confirm", "refund", "capture", "void", "expire", "refund_request", "account"}[t]
}

// Topic returns the topic of the command, from its type alone.
func (c Command) Topic() Topic {
	switch c.Type {
	case TypeTransfer:
		return TopicTransfer
	case TypeFund:
		return TopicFund
	case TypeCredit:
		return TopicCredit
	case TypeConfirm:
		return TopicConfirm
	case TypeRefuse:
		return TopicRefund
	case TypeCapture:
		return TopicCapture
	case TypeVoid:
		return TopicVoid
	case TypeExpire:
		return TopicExpire
	case TypeRefund:
		return TopicRefundRequest
	case TypeClose, TypeFreeze, TypeUnfreeze:
		return TopicAccount
	}
	return TopicUnknown
}

// Stats counts what a ledger did: outcomes, deliveries by topic, duplicates
// by the layer that caught them and the topic they arrived on, and the
// guards that fired. It is safe for concurrent use; the zero value is
// ready.
type Stats struct {
	Deliveries         atomic.Int64 // messages delivered, redeliveries included (the sum over topics)
	Applied            atomic.Int64
	Rejected           atomic.Int64
	Conflicts          atomic.Int64
	Parked             atomic.Int64 // saga steps that arrived before the state they need
	Invalid            atomic.Int64
	AwaitingAccount    atomic.Int64 // requests naming an account that does not exist, dead-lettered unrecorded
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
	// StepsSent counts the saga steps the ledger published itself right
	// after the COMMIT that wrote them, acked by their destination streams
	// (ledgerstream.StepSender); StepsLeft, those it left to the relay: not
	// published, not acked in time, or beyond its queue.
	StepsSent, StepsLeft atomic.Int64
	// OutboxPruned counts sent outbox rows deleted by the retention job.
	OutboxPruned atomic.Int64
	// EventsPruned counts events deleted after their retention.
	EventsPruned atomic.Int64
	// AccountIDCollisions counts the IDs minted for a new account that
	// another account already had (a node's IDs repeated, after its clock
	// was stepped): each was refused and another minted.
	AccountIDCollisions atomic.Int64

	delivered [numTopics]atomic.Int64

	mu   sync.Mutex
	dups map[DuplicateKey]int64
}

// DuplicateKey is what duplicates are counted by: the layer that caught
// them, the topic they arrived on and why they were sent.
type DuplicateKey struct {
	Layer Layer
	Topic Topic
	Cause Cause
}

// Delivered counts one delivery of a message of topic t.
func (s *Stats) Delivered(t Topic) {
	if t >= numTopics {
		t = TopicUnknown
	}
	s.delivered[t].Add(1)
	s.Deliveries.Add(1)
}

// DeliveriesByTopic returns the deliveries so far, by topic.
func (s *Stats) DeliveriesByTopic() map[Topic]int64 {
	out := make(map[Topic]int64, numTopics)
	for _, t := range Topics {
		out[t] = s.delivered[t].Load()
	}
	return out
}

// Caught counts one duplicate caught.
func (s *Stats) Caught(c Caught) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dups == nil {
		s.dups = map[DuplicateKey]int64{}
	}
	s.dups[DuplicateKey{c.Layer, c.Topic, c.Cause}]++
}

// Duplicates returns the duplicates caught so far, by layer.
func (s *Stats) Duplicates() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for k, n := range s.dups {
		out[string(k.Layer)] += n
	}
	return out
}

// DuplicatesByKey returns the duplicates caught so far, by layer, topic
// and cause.
func (s *Stats) DuplicatesByKey() map[DuplicateKey]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.dups)
}

// DuplicatesByCause returns the duplicates caught so far, by cause.
func (s *Stats) DuplicatesByCause() map[Cause]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[Cause]int64{}
	for k, n := range s.dups {
		out[k.Cause] += n
	}
	return out
}

// Record counts one result of a command of topic t. A duplicate is counted
// with its cause unknown: a receiver that knows how its message came
// counts it with Caught instead.
func (s *Stats) Record(t Topic, r Result) {
	switch r.Kind {
	case Applied:
		s.Applied.Add(1)
	case Rejected:
		s.Rejected.Add(1)
	case Duplicate:
		s.Caught(Caught{Topic: t, Layer: r.Layer, Cause: CauseUnknown})
	case Conflict:
		s.Conflicts.Add(1)
	case Invalid:
		s.Invalid.Add(1)
	case Parked:
		s.Parked.Add(1)
	case AwaitingAccount:
		s.AwaitingAccount.Add(1)
	}
}
