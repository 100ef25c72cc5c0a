package ledger

import "time"

// Cause is why a duplicate arrived: which sender sent the same work again,
// and why. Every layer that catches a duplicate (Layer) attributes it to
// one cause, from what the message carries (its delivery count, the
// headers its publisher set) and, at the HTTP edge, from the request
// itself. The values are metric label values (the "cause" label of
// paymesh_duplicates_total and paymesh_duplicate_age_seconds): a small
// closed set.
type Cause string

// The causes of a duplicate.
const (
	// CauseClientRetry is a client sending the same request again (the same
	// Idempotency-Key, or the same command, as a new request), in any
	// region.
	CauseClientRetry Cause = "client_retry"
	// CauseRepublish is a router publishing the same message again with the
	// same Nats-Msg-Id: a forward retried after its PubAck was lost or late,
	// or a second copy of one publish.
	CauseRepublish Cause = "republish"
	// CauseRedelivery is JetStream delivering a message again: its ack was
	// lost or came too late (a delivery count above 1).
	CauseRedelivery Cause = "redelivery"
	// CauseDLQReplay is an operator replaying a dead letter (paymesh dlq
	// replay) whose command had applied meanwhile.
	CauseDLQReplay Cause = "dlq_replay"
	// CauseSagaResend is an outbox relay sending a saga step again.
	CauseSagaResend Cause = "saga_resend"
	// CauseUnknown is a duplicate whose message says nothing of its sender:
	// a publish without the attempt header every paymesh publisher sets.
	CauseUnknown Cause = "unknown"
)

// Causes lists every cause.
var Causes = []Cause{CauseClientRetry, CauseRepublish, CauseRedelivery, CauseDLQReplay, CauseSagaResend, CauseUnknown}

// Arrival is what a delivered message says of how it came, the facts a
// duplicate's cause is decided from.
type Arrival struct {
	// Deliveries is JetStream's delivery count: 1 on the first delivery.
	Deliveries uint64
	// Attempt is the publisher's attempt at sending it (the Paymesh-Attempt
	// header: 1 the first time), 0 when the message does not say.
	Attempt int
	// Replay marks a message replayed from the dead-letter stream.
	Replay bool
	// Step marks a saga step, which only an outbox relay sends.
	Step bool
}

// Cause decides why a duplicate that arrived so was sent: a replay from
// the dead-letter stream; else a redelivery (JetStream's second delivery
// or later); else, when the publisher did not say its attempt, unknown; a
// saga step sent again by its relay; a publish retried by the router; or,
// sent once and delivered once, a new request of the same key: the client
// retried.
func (a Arrival) Cause() Cause {
	switch {
	case a.Replay:
		return CauseDLQReplay
	case a.Deliveries > 1:
		return CauseRedelivery
	case a.Attempt <= 0:
		return CauseUnknown
	case a.Step:
		return CauseSagaResend
	case a.Attempt > 1:
		return CauseRepublish
	}
	return CauseClientRetry
}

// Caught is one duplicate caught: the topic it arrived on, the layer that
// caught it, why it was sent, and its age.
type Caught struct {
	Topic Topic
	Layer Layer
	Cause Cause
	// Age is the time since the first effect of the same key (AgeOf).
	Age time.Duration
}

// AgeOf returns the age at now of a duplicate of cmd answered r: the time
// since r.FirstAt, the first effect of its key as the layer that caught it
// recorded it, or, when that layer keeps no time (the state machine, a
// credit already recorded), since the request's creation
// (Command.CreatedAt), which is earlier than its first effect by that
// effect's own delay. It is never negative.
func AgeOf(cmd Command, r Result, now time.Time) time.Duration {
	from := r.FirstAt
	if from.IsZero() {
		from = cmd.CreatedAt
	}
	if from.IsZero() || from.After(now) {
		return 0
	}
	return now.Sub(from)
}
