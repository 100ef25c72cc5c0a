package chaos

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/router/routerd"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/jsfault"
	"github.com/paymesh/paymesh/services/ledger"
)

// This file holds the faulty runtime of scenarios 2, 7 and 8: hooks and
// decorators installed through the ledger consumer's and the router's
// seams (see bugs.go), which remove the protection each scenario attacks.

// ackBeforeApply decorates a ledger's JetStream handle so that its
// consumers ack every message as it is delivered, before the store applies
// it (scenario 2): a worker that dies before its COMMIT has acknowledged
// transfers it never applied.
func ackBeforeApply(js jetstream.JetStream) jetstream.JetStream {
	return jsfault.Wrap(js, nil, func(m jetstream.Msg) jetstream.Msg {
		_ = m.Ack()
		return m
	})
}

// ackedAnyway is a router's or a ledger's JetStream whose asynchronous
// publishes of the messages fake picks are answered at once with a PubAck,
// whether or not the stream stored them (scenarios 7 and 8): the message
// is still sent, but its real PubAck, an error and even a publish that
// could not be queued are ignored. Every other call goes to the handle it
// wraps. (The forwarder, the relay and the ledger's step sender publish
// with PublishMsgAsync only.)
type ackedAnyway struct {
	jetstream.JetStream
	fake func(*nats.Msg) bool
}

// PublishMsgAsync publishes m; when fake picks it, it returns a future that
// is already acknowledged, and never an error.
func (j ackedAnyway) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if !j.fake(m) {
		return j.JetStream.PublishMsgAsync(m, opts...)
	}
	_, _ = j.JetStream.PublishMsgAsync(m, opts...)
	return newAckedFuture(m), nil
}

// ackedFuture is a PubAckFuture answered with a PubAck no stream sent.
type ackedFuture struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func newAckedFuture(m *nats.Msg) ackedFuture {
	f := ackedFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error)}
	f.ok <- &jetstream.PubAck{}
	return f
}

// Ok returns the faked PubAck.
func (f ackedFuture) Ok() <-chan *jetstream.PubAck { return f.ok }

// Err returns a channel that never yields an error.
func (f ackedFuture) Err() <-chan error { return f.err }

// Msg returns the message published.
func (f ackedFuture) Msg() *nats.Msg { return f.msg }

// relayed picks the saga steps (credit, confirm, refuse, expire), which
// the ledger that committed them sends, or the relay. The forwarder's
// publishes are the commands clients submitted.
func relayed(m *nats.Msg) bool {
	cmd, err := ledger.DecodeCommand(m.Data)
	return err == nil && cmd.IsStep()
}

// forwarded picks the forwarder's publishes: the client commands it moves
// from the route stream to their home region.
func forwarded(m *nats.Msg) bool {
	cmd, err := ledger.DecodeCommand(m.Data)
	return err == nil && !cmd.IsStep()
}

// wrapRouterJetStream makes every region's router publish through wrap,
// around the decorators installed before it (through the router's
// WrapJetStream seam).
func wrapRouterJetStream(c *cluster.Config, wrap func(jetstream.JetStream) jetstream.JetStream) {
	prev := c.Router
	c.Router = func(region string, rc *routerd.Config) {
		if prev != nil {
			prev(region, rc)
		}
		rc.WrapJetStream = wrapped(rc.WrapJetStream, wrap)
	}
}

// attemptBlind is a router that does not say its attempt: every publish
// leaves without the Paymesh-Attempt header, so a duplicate's copy cannot
// tell a retry from a new request.
type attemptBlind struct{ jetstream.JetStream }

// PublishMsg publishes m without its attempt header.
func (j attemptBlind) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	m.Header.Del(ledgerstream.HeaderAttempt)
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

// PublishMsgAsync publishes m without its attempt header.
func (j attemptBlind) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	m.Header.Del(ledgerstream.HeaderAttempt)
	return j.JetStream.PublishMsgAsync(m, opts...)
}

// wrapped returns a JetStream decorator that applies inner (if any), then
// wrap: a seam's decorators installed one after another.
func wrapped(inner, wrap func(jetstream.JetStream) jetstream.JetStream) func(jetstream.JetStream) jetstream.JetStream {
	if inner == nil {
		return wrap
	}
	return func(js jetstream.JetStream) jetstream.JetStream { return wrap(inner(js)) }
}

// classBlind is scenario 12's class bug: the ledger takes every delivery
// as sent on its command's own class (a decorator of the ledger's
// JetStream handle that rewrites each delivery's subject), so a fund or a
// saga step an API user sent as a client command is applied.
func classBlind(ids *idgen.Regions) func(jetstream.JetStream) jetstream.JetStream {
	return func(js jetstream.JetStream) jetstream.JetStream {
		return jsfault.Wrap(js, nil, func(m jetstream.Msg) jetstream.Msg {
			cmd, err := ledger.DecodeCommand(m.Data())
			addr, perr := subjects.ParseLedger(m.Subject())
			if err != nil || perr != nil {
				return m
			}
			from := addr.Region
			if cmd.IsStep() {
				if r, err := cmd.SentFrom(ids); err == nil {
					from = r
				}
			}
			return subjectAs{Msg: m, subject: subjects.LedgerSubject(addr.Region, addr.Shard, ledgerstream.ClassOf(cmd), from)}
		})
	}
}

// subjectAs is a delivery that says it came on subject.
type subjectAs struct {
	jetstream.Msg
	subject string
}

func (m subjectAs) Subject() string { return m.subject }
