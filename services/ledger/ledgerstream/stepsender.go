package ledgerstream

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/services/ledger"
)

// Saga steps sent by the ledger.
//
// A saga step is written to the outbox in the transaction of the step that
// causes it (the debit writes the credit, the credit writes the confirm).
// The relay (services/router) reads the outbox and sends it; woken by the
// commit, that is still a round of its own after the COMMIT: read, publish,
// PubAck, mark, about 9 ms under load, twice in a cross-region transfer
// (docs/BENCHMARKS.md). A StepSender takes that round out: the
// consumer hands it the steps of each batch right after COMMIT, it
// publishes them at once, with the step's Nats-Msg-Id, on the subject the
// relay would use, and once the destination stream acked them it marks
// their rows sent, as the relay would.
//
// The outbox stays the record: the store writes a step the sender will
// publish due StepHandoff later (postgres.Config.StepHandoff), so the relay
// leaves it alone unless the sender has not marked it sent by then: its
// publish failed or was not acked in time, its queue was full, or the
// process died between the COMMIT and the mark. A step sent by both is
// absorbed by the destination's Msg-Id window and consume-log, as a relay
// crash between PubAck and mark always was. Nothing marks a row sent
// without its PubAck. A region whose step was not acked has its steps left
// to the relay for stepRegionPause, so that a region down cannot fill the
// connection's pending PubAcks and stall the batch loop.

// StepOutbox is what the sender needs of its region's outbox: marking the
// steps, by Nats-Msg-Id, that their destination streams acked and those
// whose publish failed. postgres.Store implements it.
type StepOutbox interface {
	MarkStepsSent(ctx context.Context, msgIDs []string) error
	MarkStepsFailed(ctx context.Context, msgIDs []string) error
}

// StepSender bounds.
const (
	// DefaultStepHandoff is how long the relay leaves a step to the
	// ledger that wrote it: far beyond a PubAck's round trip between
	// regions, short beside a transfer in transit.
	DefaultStepHandoff = 5 * time.Second
	// StepAckWait is how long the sender waits for a step's PubAck
	// before it leaves the step to the relay (and the asynchronous
	// publish timeout of the ledger's JetStream handle).
	StepAckWait = 2 * time.Second
	// stepQueue is how many published steps may wait for their PubAcks;
	// beyond, a step is left to the relay instead of holding up the
	// batch loop.
	stepQueue = 8192
	// stepMarkBatch is the most steps marked in one statement.
	stepMarkBatch = 512
	// stepRegionPause is how long a region whose step was not acked has
	// its steps left to the relay, which backs off from it on its own.
	stepRegionPause = DefaultStepHandoff
)

// StepSender publishes the saga steps a committed batch wrote, for the
// ledger of region from. Send is called by the consumer after COMMIT; Run
// waits for the PubAcks and marks the rows.
type StepSender struct {
	js      jetstream.JetStream
	from    string
	shards  int
	outbox  StepOutbox
	stats   *ledger.Stats
	observe func(context.Context, ledger.Caught)
	log     *slog.Logger
	pending chan sentStep
	// down holds, for each region whose step was not acked lately, until
	// when the sender leaves that region's steps to the relay at once
	// (region → time.Time): publishes into a region that does not answer
	// would fill the connection's pending PubAcks, and a full set blocks
	// the batch loop that publishes.
	down sync.Map
}

// sentStep is a step published and waiting for its PubAck; one whose
// publish failed has neither future nor span.
type sentStep struct {
	cmd      ledger.Command
	region   string
	msgID    string
	future   jetstream.PubAckFuture
	span     trace.Span
	deadline time.Time
}

// NewStepSender returns a sender that publishes through js the steps of
// topo's region, to ledger subjects of topo's shard count (every region
// has the same), and marks them in outbox. It counts them in stats
// (StepsSent, StepsLeft), which may be nil, with the duplicates the
// destination streams' Msg-Id windows caught (a step the relay had sent
// first, or a copy a publisher retried), which it also hands to observe
// (if set) with the step's span, as the consumer's Observer.Duplicate.
// js's asynchronous publishes should time out
// (jetstream.WithPublishAsyncTimeout), so that PubAcks never answered
// cannot pile up pending.
func NewStepSender(js jetstream.JetStream, topo Topology, outbox StepOutbox, stats *ledger.Stats,
	observe func(context.Context, ledger.Caught), log *slog.Logger) *StepSender {
	if stats == nil {
		stats = &ledger.Stats{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	topo = topo.withDefaults()
	return &StepSender{js: js, from: topo.Region, shards: topo.Shards, outbox: outbox, stats: stats, observe: observe, log: log,
		pending: make(chan sentStep, stepQueue)}
}

// Send publishes the steps due now that results hold (Result.Outbox), each
// in a producer span that is a child of its command's delivery span. It
// does not wait: Run takes the PubAcks.
func (s *StepSender) Send(ctx context.Context, results []ledger.Result, spans []trace.Span) {
	for i, r := range results {
		for _, m := range r.Outbox {
			if !m.DueAt.IsZero() {
				continue // a hold's expiry: the relay sends it when it falls due
			}
			s.send(trace.ContextWithSpan(ctx, spans[i]), m)
		}
	}
}

func (s *StepSender) send(ctx context.Context, step ledger.OutboxMessage) {
	if until, ok := s.down.Load(step.Region); ok && time.Now().Before(until.(time.Time)) {
		s.stats.StepsLeft.Add(1) // the relay sends it once due, and backs off from the region
		return
	}
	msgID := step.Command.MsgKey()
	m := StepMsg(Topology{Region: step.Region, Shards: s.shards}, step.Account, s.from, msgID, step.Command.Encode(), 1)
	sctx, span := tracer.Start(ctx, "step "+m.Subject, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(Messaging(s.from, m.Subject, msgID, "send")...))
	natstrace.Inject(sctx, m)
	st := sentStep{cmd: step.Command, region: step.Region, msgID: msgID, span: span, deadline: time.Now().Add(StepAckWait)}
	f, err := s.js.PublishMsgAsync(m)
	if err != nil {
		s.leave(span, "publish: "+err.Error())
		f, st.span = nil, nil // Run counts the attempt
	}
	st.future = f
	select {
	case s.pending <- st:
	default:
		if st.span != nil {
			s.leave(span, "the sender's queue is full")
		}
	}
}

// leave leaves a step to the relay, which sends it once it is due.
func (s *StepSender) leave(span trace.Span, why string) {
	s.stats.StepsLeft.Add(1)
	span.SetStatus(codes.Error, "left to the relay: "+why)
	span.End()
}

// Run waits for the PubAcks of the steps Send published, in order, and
// marks their rows: sent when acked, one attempt more when not (the relay
// sends those once they are due). It returns when ctx ends; the steps
// still waiting are then the relay's.
func (s *StepSender) Run(ctx context.Context) {
	var sent, failed []string
	for {
		var first sentStep
		select {
		case <-ctx.Done():
			return
		case first = <-s.pending:
		}
		sent, failed = sent[:0], failed[:0]
		for st, more := first, true; more; {
			if s.acked(ctx, st) {
				sent = append(sent, st.msgID)
			} else {
				failed = append(failed, st.msgID)
				s.down.Store(st.region, time.Now().Add(stepRegionPause))
			}
			if len(sent)+len(failed) >= stepMarkBatch {
				break
			}
			select {
			case st = <-s.pending:
			default:
				more = false
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err := s.outbox.MarkStepsSent(ctx, sent); err != nil {
			s.log.Warn("steps: mark sent (the relay sends them again once due)", "err", err, "steps", len(sent))
		}
		if err := s.outbox.MarkStepsFailed(ctx, failed); err != nil {
			s.log.Warn("steps: count failed publishes", "err", err, "steps", len(failed))
		}
	}
}

// acked waits for st's PubAck until its deadline and ends its span.
func (s *StepSender) acked(ctx context.Context, st sentStep) bool {
	if st.future == nil {
		return false // not published: left to the relay already
	}
	wait := time.NewTimer(time.Until(st.deadline))
	defer wait.Stop()
	select {
	case ack := <-st.future.Ok():
		s.stats.StepsSent.Add(1)
		if ack.Duplicate {
			s.caught(st.span, CaughtAtMsgID(st.cmd, st.future.Msg()))
		}
		st.span.End()
		return true
	case err := <-st.future.Err():
		s.leave(st.span, "not stored: "+err.Error())
	case <-wait.C:
		s.leave(st.span, "no PubAck within "+StepAckWait.String())
	case <-ctx.Done():
		s.leave(st.span, "stopping")
	}
	return false
}

// caught counts a step the destination stream's Msg-Id window caught, as
// the router counts its own publishes' duplicates, on the step's span.
func (s *StepSender) caught(span trace.Span, c ledger.Caught) {
	s.stats.Caught(c)
	span.SetAttributes(attribute.String("paymesh.dedup.outcome", "duplicate"), attribute.String("paymesh.dedup.layer", string(ledger.LayerMsgID)))
	ctx := RecordCaught(context.Background(), span, c)
	if s.observe != nil {
		s.observe(ctx, c)
	}
}
