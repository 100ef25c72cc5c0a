package router

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// Forwarding tunables.
const (
	forwardBatch  = 256
	maxRetryDelay = 5 * time.Second
)

// publishTimeout bounds the wait for the PubAcks of one batch.
func (r *Router) publishTimeout() time.Duration { return r.cfg.AckWait / 2 }

// retryDelay grows with the number of failed attempts: 100 ms, 200 ms, …,
// at most maxRetryDelay.
func retryDelay(attempt uint64) time.Duration {
	d := 100 * time.Millisecond
	for i := uint64(1); i < attempt && d < maxRetryDelay; i++ {
		d *= 2
	}
	return min(d, maxRetryDelay)
}

// ForwardDurable is the name of the route stream's durable consumer that
// forwards the commands homed in home.
func ForwardDurable(home string) string { return "forward-" + home }

// RunForwarder forwards the local route stream to the home regions' ledger
// streams until ctx ends. Each home region has its own durable consumer
// (ForwardDurable), so a region that is unreachable, whose commands wait
// with growing delays, cannot hold up the commands for the others. It
// returns an error only when it cannot set up a consumer.
func (r *Router) RunForwarder(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(r.cfg.Regions.Names()))
	for _, home := range r.cfg.Regions.Names() {
		cons, err := r.js.CreateOrUpdateConsumer(ctx, Stream(r.cfg.Region), jetstream.ConsumerConfig{
			Durable:       ForwardDurable(home),
			FilterSubject: subjects.RouteHome(r.cfg.Region, home),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       r.cfg.AckWait,
			MaxDeliver:    -1, // store and forward: never give up
			MaxAckPending: 4 * forwardBatch,
		})
		if err != nil {
			return fmt.Errorf("forwarder to %s: %w", home, err)
		}
		wg.Go(func() {
			if err := r.forwardFrom(ctx, cons, log.With("home", home)); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (r *Router) forwardFrom(ctx context.Context, cons jetstream.Consumer, log *slog.Logger) error {
	inbox := make(chan jetstream.Msg, 2*forwardBatch)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case inbox <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(2*forwardBatch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		log.Warn("forwarder consume", "err", err)
	}))
	if err != nil {
		return fmt.Errorf("forwarder: %w", err)
	}
	defer cc.Stop()
	for {
		batch, ok := ledgerstream.NextBatch(ctx, inbox, forwardBatch)
		if !ok {
			return nil
		}
		r.forward(ctx, batch, log)
	}
}

// forwardSubject returns the home ledger subject a route-stream message
// goes to, or an error unless it is a client command (the route stream
// carries nothing else) addressed by a route subject.
func forwardSubject(m jetstream.Msg) (string, ledger.Command, error) {
	cmd, err := ledger.DecodeCommand(m.Data())
	if err != nil {
		return "", cmd, err
	}
	if class := ledgerstream.ClassOf(cmd); class != subjects.ClassCommand {
		return "", cmd, fmt.Errorf("a %s is no client command (it travels on the %s class)", cmd.Type, class)
	}
	subject, err := subjects.LedgerOfRoute(m.Subject())
	return subject, cmd, err
}

// forward publishes a batch to the home ledger streams asynchronously and
// acks each local copy after its PubAck; a failed one is NAKed with a
// growing delay.
func (r *Router) forward(ctx context.Context, msgs []jetstream.Msg, log *slog.Logger) {
	futures := make([][]jetstream.PubAckFuture, len(msgs))
	spans := make([]trace.Span, len(msgs))
	cmds := make([]ledger.Command, len(msgs))
	unroutable := make([]bool, len(msgs))
	for i, m := range msgs {
		subject, cmd, err := forwardSubject(m)
		cmds[i] = cmd
		if err != nil {
			// Not a client command, or not routable: forwarding it would
			// hand the home ledger what only its own class's publishers
			// may send (a fund, a saga step). It stays in the route
			// stream's log as a terminated delivery.
			log.Error("refused a message of the route stream", "subject", m.Subject(), "err", err)
			_ = m.TermWithReason("refused: " + err.Error())
			r.cfg.Stats.Refused.Add(1)
			unroutable[i] = true
			continue
		}
		out := nats.NewMsg(subject)
		out.Data = m.Data()
		msgID := m.Headers().Get(jetstream.MsgIDHeader)
		out.Header.Set(jetstream.MsgIDHeader, msgID)
		if to := m.Headers().Get(ledgerstream.HeaderAnswerTo); to != "" {
			out.Header.Set(ledgerstream.HeaderAnswerTo, to) // the submitting API's, for the ledger to tell
		}
		parent := natstrace.Extract(ctx, m.Headers())
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(ledgerstream.Messaging(r.cfg.Region, subject, msgID, "send")...)}
		md, mdErr := m.Metadata()
		// The forward's attempt: the route stream's delivery of it.
		out.Header.Set(ledgerstream.HeaderAttempt, "1")
		if mdErr == nil {
			out.Header.Set(ledgerstream.HeaderAttempt, strconv.FormatUint(md.NumDelivered, 10))
		}
		if tid := trace.SpanContextFromContext(parent).TraceID(); mdErr == nil && tid.IsValid() {
			// As for deliveries: a retried forward links to its first attempt.
			parent = natstrace.WithSpanID(parent, natstrace.AttemptSpanID(tid, md.Stream, md.Sequence.Stream, md.NumDelivered))
			if md.NumDelivered > 1 {
				first := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, TraceFlags: trace.FlagsSampled,
					SpanID: natstrace.AttemptSpanID(tid, md.Stream, md.Sequence.Stream, 1)})
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: first}))
			}
		}
		sctx, span := tracer.Start(parent, "forward "+subject, opts...)
		if mdErr == nil && md.NumDelivered > 1 {
			span.AddEvent("retry", trace.WithAttributes(attribute.Int64("paymesh.attempt", int64(md.NumDelivered))))
		}
		natstrace.Inject(sctx, out)
		spans[i] = span
		futures[i] = r.publish(out)
	}
	wctx, cancel := context.WithTimeout(ctx, r.publishTimeout())
	defer cancel()
	for i, m := range msgs {
		if unroutable[i] {
			continue
		}
		ok, dups := wait(wctx, futures[i])
		for _, d := range dups {
			r.caught(trace.ContextWithSpan(ctx, spans[i]), StageForward, d, cmds[i])
		}
		endPublish(spans[i], ok, len(dups))
		switch {
		case ok:
			r.cfg.Stats.Forwarded.Add(1)
			_ = m.Ack()
		case ctx.Err() != nil:
			return // shutting down: redelivered after AckWait
		default:
			r.cfg.Stats.ForwardRetries.Add(1)
			var n uint64 = 1
			if md, err := m.Metadata(); err == nil {
				n = md.NumDelivered
			}
			_ = m.NakWithDelay(retryDelay(n))
		}
	}
}

// endPublish records a publish's outcome on its span and ends it.
func endPublish(span trace.Span, ok bool, duplicates int) {
	if span == nil {
		return
	}
	if !ok {
		span.SetStatus(codes.Error, "not acked; retried later")
	}
	if duplicates > 0 {
		span.SetAttributes(attribute.String("paymesh.dedup.outcome", "duplicate"), attribute.String("paymesh.dedup.layer", "msg_id"))
	}
	span.End()
}

// publish sends a message asynchronously. A publish that cannot even be
// queued yields no futures.
func (r *Router) publish(m *nats.Msg) []jetstream.PubAckFuture {
	f, err := r.js.PublishMsgAsync(m)
	if err != nil {
		return nil
	}
	return []jetstream.PubAckFuture{f}
}

// wait reports whether every copy was acked before ctx ended, and returns
// the copies the stream recognised as duplicates. An answer that has already
// arrived counts even when ctx has ended meanwhile, so one slow destination
// cannot make the others of its batch look failed.
func wait(ctx context.Context, fs []jetstream.PubAckFuture) (ok bool, duplicates []*nats.Msg) {
	if len(fs) == 0 {
		return false, nil
	}
	for _, f := range fs {
		var ack *jetstream.PubAck
		select {
		case ack = <-f.Ok():
		case <-f.Err():
			return false, nil
		default:
			select {
			case ack = <-f.Ok():
			case <-f.Err():
				return false, nil
			case <-ctx.Done():
				return false, nil
			}
		}
		if ack.Duplicate {
			duplicates = append(duplicates, f.Msg())
		}
	}
	return true, duplicates
}
