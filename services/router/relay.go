package router

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// Step is a saga step waiting in the region's outbox to be relayed to the
// ledger of Region.
type Step struct {
	ID      int64  // the step's row in the outbox, by which it is marked
	MsgID   string // the step's Nats-Msg-Id
	Region  string // the region whose ledger applies it
	Account string // the account whose shard carries it
	Payload []byte // the encoded ledger.Command
	// Attempts counts the relays of the step tried before.
	Attempts int
	// TraceParent continues the transfer's trace when the step is relayed.
	TraceParent string
}

// Outbox is what the relay needs of a region's outbox. The router declares
// it and knows no database: the composition root (services/router/routerd)
// hands in the ledger store's outbox, adapted to it.
type Outbox interface {
	// PendingSteps returns up to limit steps to relay now, oldest first,
	// none for the regions in skip.
	PendingSteps(ctx context.Context, limit int, skip ...string) ([]Step, error)
	// MarkSent records that the steps were acked by their destination
	// streams: they are never relayed again.
	MarkSent(ctx context.Context, ids []int64) error
	// MarkFailed counts a failed relay attempt of the steps.
	MarkFailed(ctx context.Context, ids []int64) error
	// Written receives a signal after steps due now were written (one
	// signal may stand for several writes), so that the relay reads at once
	// instead of at its next poll. Nil when the outbox cannot tell.
	Written() <-chan struct{}
}

// Relay tunables. relayIdle is the poll of an idle relay: with an outbox
// that signals its writes (Outbox.Written) the relay reads as soon as a
// step is committed, and the poll only finds the steps that fall due later
// (a hold's expiry) and those written while the signals were lost.
const (
	relayBatch = 256
	relayIdle  = 20 * time.Millisecond
)

// RunRelay relays the region's outbox until ctx ends: each unsent saga step
// is published to the ledger stream of the region that applies it, with the
// step's Nats-Msg-Id, and marked sent only after the PubAck. An idle relay
// reads again when the outbox signals a write, or after relayIdle. A region that
// fails is skipped for a growing delay, so that it cannot hold up steps for
// the others. A crash between the PubAck and the mark makes the step go out
// again, which the destination's Msg-Id window and consume-log absorb.
func (r *Router) RunRelay(ctx context.Context, outbox Outbox, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	down := regionBackoff{}
	for ctx.Err() == nil {
		steps, err := outbox.PendingSteps(ctx, relayBatch, down.skip()...)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("relay: read outbox", "err", err)
			}
			idle(ctx, nil, time.Second)
			continue
		}
		if len(steps) == 0 {
			idle(ctx, outbox.Written(), relayIdle)
			continue
		}
		sent, failed, failedRegions := r.relay(ctx, steps)
		if ctx.Err() != nil {
			return
		}
		r.mark(ctx, outbox, sent, failed, log)
		for region, failures := range down.update(steps, failedRegions) {
			log.Warn("relay: steps not acked; region skipped for a while", "region", region,
				"failures", failures, "retry_in", retryDelay(failures), "unacked", failedRegions[region])
		}
	}
}

// relay publishes steps and waits for their PubAcks, up to the publish
// timeout. It returns the IDs of the steps acked and of those not, and how
// many of the latter each region has.
func (r *Router) relay(ctx context.Context, steps []Step) (sent, failed []int64, failedRegions map[string]int) {
	futures := make([][]jetstream.PubAckFuture, len(steps))
	spans := make([]trace.Span, len(steps))
	for i, st := range steps {
		futures[i], spans[i] = r.publishStep(ctx, st)
	}
	wctx, cancel := context.WithTimeout(ctx, r.publishTimeout())
	defer cancel()
	failedRegions = map[string]int{}
	for i, st := range steps {
		ok, dups := wait(wctx, futures[i])
		if len(dups) > 0 {
			cmd, _ := ledger.DecodeCommand(st.Payload) // its topic and age; the outbox wrote it
			for _, d := range dups {
				r.caught(trace.ContextWithSpan(ctx, spans[i]), StageRelay, d, cmd)
			}
		}
		endPublish(spans[i], ok, len(dups))
		if !ok {
			failed = append(failed, st.ID)
			failedRegions[st.Region]++
			continue
		}
		sent = append(sent, st.ID)
	}
	return sent, failed, failedRegions
}

// publishStep publishes st to its region's ledger stream, in a producer
// span that continues the transfer's trace, and returns the PubAck futures
// and the span, which the caller ends.
func (r *Router) publishStep(ctx context.Context, st Step) ([]jetstream.PubAckFuture, trace.Span) {
	m := ledgerstream.StepMsg(r.topo(st.Region), st.Account, r.cfg.Region, st.MsgID, st.Payload, st.Attempts+1)
	attrs := ledgerstream.Messaging(r.cfg.Region, m.Subject, st.MsgID, "send")
	if st.Attempts > 0 {
		attrs = append(attrs, attribute.Int(telemetry.AttrAttempt, st.Attempts+1)) // recorded whatever the sampler's ratio
	}
	sctx, span := tracer.Start(natstrace.WithTraceParent(ctx, st.TraceParent), "relay "+m.Subject,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	if st.Attempts > 0 {
		span.AddEvent("retry", trace.WithAttributes(attribute.Int64("paymesh.attempt", int64(st.Attempts+1))))
	}
	natstrace.Inject(sctx, m)
	return r.publish(m), span
}

// mark records in the outbox which steps were acked and which failed, and
// counts them.
func (r *Router) mark(ctx context.Context, outbox Outbox, sent, failed []int64, log *slog.Logger) {
	if err := outbox.MarkSent(ctx, sent); err != nil {
		log.Warn("relay: mark sent (the steps go out again)", "err", err)
	} else {
		r.cfg.Stats.Relayed.Add(int64(len(sent)))
	}
	if len(failed) > 0 {
		r.cfg.Stats.RelayRetries.Add(int64(len(failed)))
		_ = outbox.MarkFailed(ctx, failed)
	}
}

// regionBackoff is, for each region whose relays failed, until when the
// relay skips it.
type regionBackoff map[string]*backoffState

type backoffState struct {
	until    time.Time
	failures uint64
}

// skip returns the regions to skip now.
func (b regionBackoff) skip() []string {
	var skip []string
	for region, s := range b {
		if time.Now().Before(s.until) {
			skip = append(skip, region)
		}
	}
	return skip
}

// update backs off further from each region of failed whose delay is
// over, and forgets the regions of steps whose relays succeeded. It
// returns the regions it backed off further, with their failure counts.
func (b regionBackoff) update(steps []Step, failed map[string]int) (further map[string]uint64) {
	for _, st := range steps {
		if failed[st.Region] == 0 {
			delete(b, st.Region)
			continue
		}
		s := b[st.Region]
		if s == nil {
			s = &backoffState{}
			b[st.Region] = s
		}
		if time.Now().After(s.until) {
			s.failures++
			s.until = time.Now().Add(retryDelay(s.failures))
			if further == nil {
				further = map[string]uint64{}
			}
			further[st.Region] = s.failures
		}
	}
	return further
}

// idle waits for a signal on written (never, when nil), for d, or for ctx
// to end, whichever comes first.
func idle(ctx context.Context, written <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-written:
	case <-t.C:
	}
}
