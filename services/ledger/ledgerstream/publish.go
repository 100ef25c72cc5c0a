package ledgerstream

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
)

// What the ledger's step sender and the routers (the forwarder and the
// relay) share about the messages they publish into ledger streams.

// StepMsg is the NATS message of a saga step bound for topo's region, sent
// from region from: the step's account's shard and class, its Nats-Msg-Id,
// its encoded command as payload and the sender's attempt at it.
func StepMsg(topo Topology, account, from, msgID string, payload []byte, attempt int) *nats.Msg {
	m := nats.NewMsg(topo.Subject(account, subjects.ClassStep, from))
	m.Data = payload
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	m.Header.Set(HeaderAttempt, strconv.Itoa(attempt))
	return m
}

// Messaging returns the OTel messaging attributes of a publish (op
// "send") by a service of region.
func Messaging(region, subject, msgID, op string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.destination.name", subject),
		attribute.String("messaging.message.id", msgID),
		attribute.String("messaging.operation.type", op),
		attribute.String("paymesh.region", region),
	}
}

// CaughtAtMsgID is a publish of cmd that a stream's Msg-Id window caught,
// m being the copy it caught: layer msg_id, the cause its attempt header
// says (0, unknown, when it has none), aged from the command's creation.
func CaughtAtMsgID(cmd ledger.Command, m *nats.Msg) ledger.Caught {
	var attempt int
	if m != nil {
		attempt, _ = strconv.Atoi(m.Header.Get(HeaderAttempt))
	}
	return ledger.Caught{Topic: cmd.Topic(), Layer: ledger.LayerMsgID, Age: ledger.AgeOf(cmd, ledger.Result{}, time.Now()),
		Cause: ledger.Arrival{Deliveries: 1, Attempt: attempt, Step: cmd.IsStep()}.Cause()}
}
