// Package jsfault decorates a JetStream handle for fault tests and the
// demo: a producer's retry (a second publish under the same Nats-Msg-Id),
// and a look at every message a consumer delivers before the consumer's
// handler does (to drop its ack after the commit, ack it too early, or hold
// it back). The services take it through their WrapJetStream seams, so
// nothing of it ships and the services' hot paths hold no fault switch.
package jsfault

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// JetStream is a decorated JetStream handle. Its zero hooks change nothing.
type JetStream struct {
	jetstream.JetStream
	// Twice, if set, is asked before every asynchronous publish; when it
	// answers true the message is published a second time under the same
	// Nats-Msg-Id, as a producer that retries: the copy's attempt header
	// (ledgerstream.HeaderAttempt) is one more than the first's. The future returned answers
	// once both copies are answered: an error if either failed (the
	// publisher sends again, as it would), else the second copy's PubAck,
	// which says Duplicate when the stream caught it, so the publisher
	// counts what its stream's window caught. When the second copy cannot
	// be queued the first one's future is returned.
	Twice func() bool
	// Injected, if set, is told of (handed) every second copy answered after the
	// stream stored its first copy as new: a duplicate the stream's
	// Nats-Msg-Id window must catch, and the publisher count. (A first copy
	// that was itself a duplicate, a message published again, makes the
	// second one no extra catch: the publisher counts one duplicate per
	// future.)
	Injected func(copy *nats.Msg)
	// Deliver, if set, is handed every message a consumer created or
	// looked up through this handle delivers to Consume's handler, before
	// the handler; the handler gets the message it returns, or nothing when
	// it returns nil (the delivery is lost, as with a consumer process that
	// died holding it: JetStream delivers it again after its AckWait). It
	// may block (the consumer's buffer then fills and it stops pulling).
	Deliver func(jetstream.Msg) jetstream.Msg
}

// Wrap returns js decorated with twice and deliver (either may be nil).
func Wrap(js jetstream.JetStream, twice func() bool, deliver func(jetstream.Msg) jetstream.Msg) *JetStream {
	return &JetStream{JetStream: js, Twice: twice, Deliver: deliver}
}

// PublishMsgAsync publishes m, twice when Twice says so.
func (j *JetStream) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f, err := j.JetStream.PublishMsgAsync(m, opts...)
	if err != nil || j.Twice == nil || !j.Twice() {
		return f, err
	}
	c := retried(m)
	again, err := j.JetStream.PublishMsgAsync(c, opts...)
	if err != nil {
		return f, nil
	}
	var injected func()
	if j.Injected != nil {
		injected = func() { j.Injected(c) }
	}
	return both(f, again, injected), nil
}

// retried returns a copy of m as its publisher's next attempt: the same
// subject, data and headers, and an attempt header one higher (2 when m
// carries none).
func retried(m *nats.Msg) *nats.Msg {
	c := nats.NewMsg(m.Subject)
	c.Data = m.Data
	for k, vs := range m.Header {
		c.Header[k] = append([]string(nil), vs...)
	}
	n, err := strconv.Atoi(m.Header.Get(ledgerstream.HeaderAttempt))
	if err != nil || n < 1 {
		n = 1
	}
	c.Header.Set(ledgerstream.HeaderAttempt, strconv.Itoa(n+1))
	return c
}

// pubAckWait bounds how long both waits for a copy's answer (nats.go
// answers every future, with an error at the latest when its connection
// closes; the bound only keeps a lost answer from holding a goroutine).
const pubAckWait = time.Minute

// both returns a future answered once first and second are: an error if
// either failed, else second's PubAck, after telling injected (if set)
// when first's was new.
func both(first, second jetstream.PubAckFuture, injected func()) jetstream.PubAckFuture {
	p := &pair{PubAckFuture: second, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	go func() {
		var acks []*jetstream.PubAck
		for _, f := range []jetstream.PubAckFuture{first, second} {
			select {
			case ack := <-f.Ok():
				acks = append(acks, ack)
			case err := <-f.Err():
				p.err <- err
				return
			case <-time.After(pubAckWait):
				p.err <- errors.New("jsfault: no PubAck within a minute")
				return
			}
		}
		if !acks[0].Duplicate && injected != nil {
			injected()
		}
		if acks[0].Duplicate {
			// The first copy was the repeat the stream caught (a message
			// published again): it is the one the publisher counts.
			p.msg.Store(first.Msg())
		}
		p.ok <- acks[1]
	}()
	return p
}

// pair is the future of a message published twice.
type pair struct {
	jetstream.PubAckFuture // the second copy's
	ok                     chan *jetstream.PubAck
	err                    chan error
	// msg is the first copy when it was itself a duplicate; set before ok
	// is answered.
	msg atomic.Pointer[nats.Msg]
}

func (p *pair) Ok() <-chan *jetstream.PubAck { return p.ok }
func (p *pair) Err() <-chan error            { return p.err }

// Msg returns the copy whose duplicate the publisher counts: the second,
// unless the first was a duplicate already.
func (p *pair) Msg() *nats.Msg {
	if m := p.msg.Load(); m != nil {
		return m
	}
	return p.PubAckFuture.Msg()
}

// CreateOrUpdateConsumer returns the consumer, its deliveries decorated.
func (j *JetStream) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := j.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
	return j.consumer(c), err
}

// CreateConsumer returns the consumer, its deliveries decorated.
func (j *JetStream) CreateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := j.JetStream.CreateConsumer(ctx, stream, cfg)
	return j.consumer(c), err
}

// Consumer returns the consumer, its deliveries decorated.
func (j *JetStream) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	c, err := j.JetStream.Consumer(ctx, stream, name)
	return j.consumer(c), err
}

func (j *JetStream) consumer(c jetstream.Consumer) jetstream.Consumer {
	if c == nil || j.Deliver == nil {
		return c
	}
	return consumer{Consumer: c, deliver: j.Deliver}
}

// consumer hands Consume's deliveries to deliver first. A delivery that
// deliver turns into nil never reaches the handler: it is lost as with a
// consumer process that died holding it, and JetStream delivers it again
// after its AckWait.
type consumer struct {
	jetstream.Consumer
	deliver func(jetstream.Msg) jetstream.Msg
}

func (c consumer) Consume(h jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	return c.Consumer.Consume(func(m jetstream.Msg) {
		if m = c.deliver(m); m != nil {
			h(m)
		}
	}, opts...)
}

// DropAck returns m whose Ack asks drop first: when it answers true the
// ack is lost on its way (nothing is sent, and Ack reports success), so
// JetStream delivers the message again after its AckWait. A consumer that
// acks only what its transaction committed sees every dropped ack after
// the commit.
func DropAck(m jetstream.Msg, drop func() bool) jetstream.Msg {
	return droppedAck{Msg: m, drop: drop}
}

type droppedAck struct {
	jetstream.Msg
	drop func() bool
}

func (m droppedAck) Ack() error {
	if m.drop() {
		return nil
	}
	return m.Msg.Ack()
}
