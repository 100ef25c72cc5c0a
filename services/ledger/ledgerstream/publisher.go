package ledgerstream

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
)

// Publisher sends commands to their region's ledger stream, each on the
// subject of its kind's class, as the service that sends that kind would:
// a client command and a fund from the ledger's own region, a saga step
// from the region that sends it (ledger.Command.SentFrom). Every publish
// of a command, first or retried, carries the same Nats-Msg-Id (the
// command's MsgKey), so JetStream drops a retry inside its duplicate
// window.
type Publisher struct {
	js    jetstream.JetStream
	topo  Topology
	ids   *idgen.Regions
	stats *ledger.Stats
}

// NewPublisher returns a Publisher for the region of topo; ids tells a
// saga step's sending region. stats, if not nil, counts duplicates
// JetStream caught.
func NewPublisher(js jetstream.JetStream, topo Topology, ids *idgen.Regions, stats *ledger.Stats) *Publisher {
	return &Publisher{js: js, topo: topo.withDefaults(), ids: ids, stats: stats}
}

// Msg builds the NATS message of a command: subject by source account
// (destination for funding) and class, Nats-Msg-Id = MsgKey.
func (p *Publisher) Msg(cmd ledger.Command) *nats.Msg {
	from := p.topo.Region
	if cmd.IsStep() {
		if r, err := cmd.SentFrom(p.ids); err == nil {
			from = r
		}
	}
	m := nats.NewMsg(p.topo.CommandSubject(cmd, from))
	m.Data = cmd.Encode()
	m.Header.Set(jetstream.MsgIDHeader, cmd.MsgKey())
	m.Header.Set(HeaderAttempt, "1") // a caller that publishes it again is a new request of the key
	return m
}

// Publish sends a command and waits for the stream's ack. It reports
// whether JetStream recognised it as a duplicate, and returns an error when
// the stream did not ack; the caller retries with the same command.
func (p *Publisher) Publish(ctx context.Context, cmd ledger.Command) (duplicate bool, err error) {
	ack, err := p.js.PublishMsg(ctx, p.Msg(cmd), jetstream.WithExpectStream(p.topo.Stream()))
	if err != nil {
		return false, fmt.Errorf("publish %s: %w", cmd.MsgKey(), err)
	}
	p.count(ack, cmd.Topic())
	return ack.Duplicate, nil
}

// PublishAsync sends a message without waiting. The returned future
// resolves to the ack.
func (p *Publisher) PublishAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	return p.js.PublishMsgAsync(m, jetstream.WithExpectStream(p.topo.Stream()))
}

func (p *Publisher) count(ack *jetstream.PubAck, t ledger.Topic) {
	if ack != nil && ack.Duplicate && p.stats != nil {
		// Whoever calls Publish again knows why; the publisher does not.
		p.stats.Caught(ledger.Caught{Topic: t, Layer: ledger.LayerMsgID, Cause: ledger.CauseUnknown})
	}
}
