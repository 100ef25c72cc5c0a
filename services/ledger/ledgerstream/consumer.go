package ledgerstream

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
)

// Applier applies a batch of valid commands in one transaction; the
// Postgres store implements it.
type Applier interface {
	Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error)
}

// Dead-letter headers.
//
// A message is dead-lettered when it can never apply as sent (the reason is
// a ledger.Code), or when it used up its deliveries: a client request whose
// apply failed MaxDeliver times (ReasonMaxDeliveries), a saga step whose
// apply failed MaxStepDeliver times (ReasonStepMaxDeliveries), a saga step
// parked MaxParkedDeliver times (ReasonStepParked).
const (
	HeaderDLQReason   = "Paymesh-Dlq-Reason"   // a ledger.Code, or one of the Reason constants
	HeaderDLQDetail   = "Paymesh-Dlq-Detail"   // human-readable reason
	HeaderDLQSubject  = "Paymesh-Dlq-Subject"  // the original subject
	HeaderDLQSequence = "Paymesh-Dlq-Sequence" // the original stream sequence
	HeaderDLQDelivery = "Paymesh-Dlq-Delivery" // delivery count when dead-lettered
	// HeaderDLQStored is when the ledger stream stored the original
	// (RFC 3339, nanoseconds): the stream drops the original once it is
	// dead-lettered.
	HeaderDLQStored = "Paymesh-Dlq-Stored"
)

// The headers a duplicate's cause is decided from (ledger.Arrival).
const (
	// HeaderAttempt is the publisher's attempt at sending the message: 1
	// the first time. Every paymesh publisher of the ledger stream (a
	// router's submit, forward and relay) sets it.
	HeaderAttempt = "Paymesh-Attempt"
	// HeaderReplayOf marks a command replayed from the dead-letter stream,
	// with the dead letter's sequence (paymesh dlq replay).
	HeaderReplayOf = "Paymesh-Replay-Of"
)

// ArrivalOf returns what m says of how it came: md's delivery count (nil:
// the first), the publisher's attempt, a replay. Whether it is a saga step
// is its command's to say (Arrival.Step).
func ArrivalOf(m jetstream.Msg, md *jetstream.MsgMetadata) ledger.Arrival {
	a := ledger.Arrival{Deliveries: 1}
	if md != nil {
		a.Deliveries = md.NumDelivered
	}
	h := m.Headers()
	a.Attempt, _ = strconv.Atoi(h.Get(HeaderAttempt)) // 0 when absent or not a number: unknown
	a.Replay = h.Get(HeaderReplayOf) != ""
	return a
}

// The dead-letter reasons of messages that used up their deliveries.
const (
	// ReasonMaxDeliveries: a client request whose apply failed on
	// MaxDeliver deliveries.
	ReasonMaxDeliveries = "max_deliveries"
	// ReasonStepMaxDeliveries: a saga step whose apply failed on
	// MaxStepDeliver deliveries (a poison step, or a database down for
	// longer than they take).
	ReasonStepMaxDeliveries = "step_max_deliveries"
	// ReasonStepParked: a saga step that arrived ahead of the state it
	// needs (ledger.Parked) on MaxParkedDeliver deliveries.
	ReasonStepParked = "step_parked"
)

// ConsumerConfig configures a ledger consumer.
type ConsumerConfig struct {
	Topology Topology
	// Shards lists the ledger shards this consumer applies; empty means all.
	// Each shard has its own durable JetStream consumer (ShardDurable), so
	// a shard owned by one worker is applied in stream order. Workers that
	// own the same shard share its durable: exactly-once still holds, but
	// one account's commands may then apply out of order.
	Shards []int
	// BatchSize is the most messages applied in one transaction.
	BatchSize int
	// AckWait is how long a delivery may stay unacked before redelivery.
	AckWait time.Duration
	// MaxDeliver is the delivery on which a client request whose apply
	// keeps failing is dead-lettered instead of retried.
	MaxDeliver int
	// MaxStepDeliver is the delivery on which a saga step whose apply
	// keeps failing is dead-lettered (ReasonStepMaxDeliveries). With the
	// growing delay between deliveries (a second more each time, at most
	// AckWait), the default 100 spans about 43 minutes at AckWait 30 s.
	MaxStepDeliver int
	// MaxParkedDeliver is the delivery on which a saga step still ahead
	// of its state is dead-lettered (ReasonStepParked); the default 1,000
	// spans about 8 hours at AckWait 30 s.
	MaxParkedDeliver int
	// Regions parses IDs to check that commands belong to this region.
	Regions *idgen.Regions
	Stats   *ledger.Stats
	// Observe is told what the consumer applied (metrics).
	Observe Observer
	// Steps, if set, publishes the saga steps of each committed batch
	// right after its COMMIT (the store must then write them due later:
	// postgres.Config.StepHandoff); nil leaves them to the relay.
	Steps *StepSender
	Log   *slog.Logger
}

// Observer receives what a consumer applied, for metrics; a nil func is
// skipped. The context carries the span the observation belongs to, so
// that a metric can keep its trace as an exemplar.
type Observer struct {
	// Batch is told each committed batch (its messages and the times of
	// its stages), with the batch span.
	Batch func(ctx context.Context, b Batch)
	// Stage is told each saga stage a committed step ended
	// (ledger.SagaStage) and the time since its transfer's creation, with
	// the span of the step's delivery, which is part of the transfer's
	// trace.
	Stage func(ctx context.Context, stage string, sinceCreated time.Duration)
	// Duplicate is told each duplicate caught (its layer, cause and age),
	// with the span of its delivery.
	Duplicate func(ctx context.Context, c ledger.Caught)
}

// Batch is one committed batch as the Observer sees it: its messages and
// when each stage of it happened, from the inbox to COMMIT's answer.
type Batch struct {
	// Msgs are the messages whose commands the applier took, in order.
	Msgs []jetstream.Msg
	// Stored is when the stream stored the batch's first message (zero
	// when its metadata did not say); Formed, when the batch was taken from
	// the inbox; Applying, when its commands, decoded and validated, went
	// to the applier; Done, when the applier returned.
	Stored, Formed, Applying, Done time.Time
	// Tx is when the applier's transaction began, sent COMMIT and had its
	// answer (its last attempt). It is zero when the applier ran none: every
	// command a duplicate the recent-commit cache settled.
	Tx ledger.TxTimes
}

// Waited is how long the batch's first message waited between the stream
// and the applier, 0 when its stream time is not known.
func (b Batch) Waited() time.Duration {
	if b.Stored.IsZero() {
		return 0
	}
	return b.Applying.Sub(b.Stored)
}

// Took is how long the applier took.
func (b Batch) Took() time.Duration { return b.Done.Sub(b.Applying) }

// Commit is how long COMMIT took (its WAL flush and, with a synchronous
// standby, the standby's), 0 when there was no transaction.
func (b Batch) Commit() time.Duration {
	if b.Tx.Committed.IsZero() {
		return 0
	}
	return b.Tx.Committed.Sub(b.Tx.Committing)
}

// Defaults for ConsumerConfig's zero fields.
const (
	DefaultBatchSize  = 256
	DefaultAckWait    = 30 * time.Second
	DefaultMaxDeliver = 10
	// DefaultMaxStepDeliver and DefaultMaxParkedDeliver are generous: a
	// saga step's money is in transit until the step applies.
	DefaultMaxStepDeliver   = 100
	DefaultMaxParkedDeliver = 1000
)

// Consumer applies the region's ledger stream in batches.
type Consumer struct {
	cfg     ConsumerConfig
	js      jetstream.JetStream
	applier Applier
}

// NewConsumer returns a consumer; Run starts it.
func NewConsumer(js jetstream.JetStream, applier Applier, cfg ConsumerConfig) *Consumer {
	cfg.Topology = cfg.Topology.withDefaults()
	if len(cfg.Shards) == 0 {
		cfg.Shards = AllShards(cfg.Topology)
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = DefaultAckWait
	}
	if cfg.MaxDeliver <= 0 {
		cfg.MaxDeliver = DefaultMaxDeliver
	}
	if cfg.MaxStepDeliver <= 0 {
		cfg.MaxStepDeliver = DefaultMaxStepDeliver
	}
	if cfg.MaxParkedDeliver <= 0 {
		cfg.MaxParkedDeliver = DefaultMaxParkedDeliver
	}
	if cfg.Stats == nil {
		cfg.Stats = &ledger.Stats{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Consumer{cfg: cfg, js: js, applier: applier}
}

// Run consumes its shards until ctx ends. Messages arrive through pull
// subscriptions and are applied in batches of whatever has arrived, up to BatchSize: a
// batch forms while the previous one commits. It returns an error only when
// the consumer cannot be set up.
func (c *Consumer) Run(ctx context.Context) error {
	inbox := make(chan jetstream.Msg, 2*c.cfg.BatchSize)
	for _, shard := range c.cfg.Shards {
		stop, err := c.consumeShard(ctx, shard, inbox)
		if err != nil {
			return err
		}
		defer stop()
	}

	for {
		batch, ok := NextBatch(ctx, inbox, c.cfg.BatchSize)
		if !ok {
			return nil
		}
		c.process(ctx, batch, time.Now())
	}
}

// NextBatch waits for a first message on inbox, then takes whatever else
// has already arrived, up to max: a batch forms while the previous one is
// being processed, and a lone message is not held back. It returns false
// when ctx ends first.
func NextBatch(ctx context.Context, inbox <-chan jetstream.Msg, max int) ([]jetstream.Msg, bool) {
	var batch []jetstream.Msg
	select {
	case <-ctx.Done():
		return nil, false
	case m := <-inbox:
		batch = append(batch, m)
	}
	for len(batch) < max {
		select {
		case m := <-inbox:
			batch = append(batch, m)
		default:
			return batch, true
		}
	}
	return batch, true
}

// consumeShard creates (or binds to) the shard's durable consumer and feeds
// its messages, in stream order, into inbox. The returned func stops it.
func (c *Consumer) consumeShard(ctx context.Context, shard int, inbox chan<- jetstream.Msg) (func(), error) {
	t := c.cfg.Topology
	durable := ShardDurable(shard)
	var cons jetstream.Consumer
	// Several workers may create the same durable at once; a losing
	// concurrent create is retried.
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		var err error
		cons, err = c.js.CreateOrUpdateConsumer(ctx, t.Stream(), shardConsumer(t, shard, c.cfg.AckWait, c.cfg.BatchSize))
		return struct{}{}, err
	}, backoff.WithMaxTries(5))
	if err != nil {
		return nil, fmt.Errorf("ledger consumer %s: %w", durable, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case inbox <- m:
		case <-ctx.Done(): // unacked: redelivered after AckWait
		}
	}, jetstream.PullMaxMessages(c.prefetch()), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		c.cfg.Log.Warn("ledger consume", "durable", durable, "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("ledger consumer %s: %w", durable, err)
	}
	return cc.Stop, nil
}

// prefetch is how many messages each shard's subscription may buffer. The
// worker's shards share about two batches in all: a delivered message's
// AckWait runs while it waits in the buffer, so a deep buffer would turn a
// backlog into redeliveries.
func (c *Consumer) prefetch() int {
	return max(2*c.cfg.BatchSize/len(c.cfg.Shards), 8)
}

// process handles one batch: decode and validate each message (a message
// that can never apply is dead-lettered, the rest go on), then apply the
// valid ones. formed is when the batch was taken from the inbox.
func (c *Consumer) process(ctx context.Context, msgs []jetstream.Msg, formed time.Time) {
	times := Batch{Formed: formed}
	var (
		cmds     []ledger.Command
		valid    []jetstream.Msg
		spans    []trace.Span
		arrivals []ledger.Arrival
	)
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			md = nil
		}
		arrival := ArrivalOf(m, md)
		span := c.startSpan(ctx, m, md, arrival.Attempt)
		if md != nil && md.NumDelivered > 1 {
			c.cfg.Stats.Redeliveries.Add(1)
		}
		cmd, err := ledger.DecodeCommand(m.Data())
		c.cfg.Stats.Delivered(cmd.Topic()) // the decoded type: TopicUnknown when it did not decode
		if err == nil {
			err = cmd.Validate(c.cfg.Topology.Region, c.cfg.Regions, time.Now())
		}
		if err == nil {
			err = CheckClass(m.Subject(), cmd, c.cfg.Regions)
		}
		if err != nil {
			c.cfg.Stats.Invalid.Add(1)
			c.deadLetter(ctx, m, err)
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.String("paymesh.dead_letter.reason", string(ledger.ErrorCode(err))))
			span.End()
			continue
		}
		// The saga steps this command causes continue its trace.
		cmd.Trace = natstrace.TraceParent(trace.ContextWithSpan(ctx, span))
		if len(valid) == 0 && md != nil {
			times.Stored = md.Timestamp
		}
		cmds, valid, spans = append(cmds, cmd), append(valid, m), append(spans, span)
		arrival.Step = cmd.IsStep()
		arrivals = append(arrivals, arrival)
	}
	if len(cmds) > 0 {
		c.apply(ctx, times, cmds, valid, spans, arrivals)
	}
}

var tracer = otel.Tracer("github.com/paymesh/paymesh/services/ledger/ledgerstream")

// startSpan starts the span of one delivery attempt, a child of the trace
// context in the message's headers. md is the message's metadata, nil when
// it has none; attempt is the publisher's (Arrival.Attempt).
func (c *Consumer) startSpan(ctx context.Context, m jetstream.Msg, md *jetstream.MsgMetadata, attempt int) trace.Span {
	h := m.Headers()
	attrs := make([]attribute.KeyValue, 0, 9) // room for the metadata's and an attempt: one allocation
	attrs = append(attrs,
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.destination.name", m.Subject()),
		attribute.String("messaging.message.id", h.Get(jetstream.MsgIDHeader)),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("paymesh.region", c.cfg.Topology.Region),
	)
	if attempt > 1 {
		// A publisher's retry: recorded whatever the sampler's ratio.
		attrs = append(attrs, attribute.Int(telemetry.AttrAttempt, attempt))
	}
	parent := natstrace.Extract(ctx, h)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if md != nil {
		attrs = append(attrs, attribute.Int64(telemetry.AttrDeliveryCount, int64(md.NumDelivered)),
			attribute.Int64("messaging.nats.stream_sequence", int64(md.Sequence.Stream)),
			attribute.String("messaging.consumer.group.name", md.Consumer))
		// Every attempt's span id derives from the message, so a redelivery
		// links to its first attempt, whichever process ran it.
		if tid := trace.SpanContextFromContext(parent).TraceID(); tid.IsValid() {
			parent = natstrace.WithSpanID(parent, natstrace.AttemptSpanID(tid, md.Stream, md.Sequence.Stream, md.NumDelivered))
			if md.NumDelivered > 1 {
				first := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, TraceFlags: trace.FlagsSampled,
					SpanID: natstrace.AttemptSpanID(tid, md.Stream, md.Sequence.Stream, 1)})
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: first,
					Attributes: []attribute.KeyValue{attribute.String("paymesh.link", "first_attempt")}}))
			}
		}
	}
	_, span := tracer.Start(parent, "process "+m.Subject(), append(opts, trace.WithAttributes(attrs...))...)
	return span
}

// endSpan records a delivery's outcome on its span and ends it.
func endSpan(span trace.Span, r ledger.Result) {
	RecordOutcome(span, "", r)
	span.End()
}

// RecordOutcome records on span the outcome of applying one command: the
// dedup outcome ("first" or "duplicate") and the layer that caught a
// duplicate, or the result, and the region when it is not "" (a span the
// ledger's consumer did not start, such as the API's request).
func RecordOutcome(span trace.Span, region string, r ledger.Result) {
	if region != "" {
		span.SetAttributes(attribute.String("paymesh.region", region))
	}
	switch r.Kind {
	case ledger.Duplicate:
		span.SetAttributes(attribute.String("paymesh.dedup.outcome", "duplicate"), attribute.String("paymesh.dedup.layer", string(r.Layer)))
	case ledger.Applied, ledger.Rejected:
		span.SetAttributes(attribute.String("paymesh.dedup.outcome", "first"), attribute.String("paymesh.result", r.Kind.String()))
	default:
		span.SetAttributes(attribute.String("paymesh.result", r.Kind.String()))
	}
}

// apply applies valid commands in one transaction and acks them after the
// commit.
// times holds the batch's Formed and Stored.
func (c *Consumer) apply(ctx context.Context, times Batch, cmds []ledger.Command, valid []jetstream.Msg, spans []trace.Span, arrivals []ledger.Arrival) {
	links := make([]trace.Link, len(spans))
	for i, sp := range spans {
		links[i] = trace.Link{SpanContext: sp.SpanContext()}
	}
	// The batch's transaction is a span of its own, linked to each delivery;
	// the store adds its retries to it as events.
	ctx, batchSpan := tracer.Start(ctx, "apply batch", trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("paymesh.batch.size", len(cmds)), attribute.String("paymesh.region", c.cfg.Topology.Region)))
	defer batchSpan.End()
	var tx ledger.TxTimes
	began := time.Now()
	results, err := c.applier.Apply(ledger.WithTxTimes(ctx, &tx), cmds)
	if err == nil && c.cfg.Observe.Batch != nil {
		times.Msgs, times.Applying, times.Done, times.Tx = valid, began, time.Now(), tx
		c.cfg.Observe.Batch(ctx, times)
	}
	if err != nil && len(cmds) > 1 && ctx.Err() == nil {
		// Isolate whatever failed the batch: apply one by one, so that a
		// single bad command cannot hold up or use the deliveries of others.
		c.cfg.Log.Warn("apply batch failed; applying its commands one by one", "size", len(cmds), "err", err)
		for i := range cmds {
			c.apply(ctx, times, cmds[i:i+1], valid[i:i+1], spans[i:i+1], arrivals[i:i+1])
		}
		return
	}
	if err != nil {
		for _, sp := range spans {
			sp.SetStatus(codes.Error, err.Error())
			sp.End()
		}
		if ctx.Err() != nil {
			return // shutting down: redelivered after AckWait, not a failed attempt
		}
		c.cfg.Stats.ApplyFailed.Add(1)
		c.cfg.Log.Error("apply failed; the message will be redelivered", "err", err)
		c.retryLater(ctx, valid[0], err, c.giveUp(cmds[0].IsStep(), false))
		return
	}
	if c.cfg.Steps != nil {
		c.cfg.Steps.Send(ctx, results, spans)
	}
	c.record(ctx, cmds, spans, arrivals, results)
	c.notifyAnswered(valid, cmds, results)
	var ack []jetstream.Msg
	for i, r := range results {
		switch {
		case r.DeadLetter:
			c.deadLetter(ctx, valid[i], r.Err)
		case r.Kind == ledger.Parked:
			// A saga step ahead of the state it needs: see it again later.
			c.retryLater(ctx, valid[i], r.Err, c.giveUp(true, true))
		default:
			ack = append(ack, valid[i])
		}
	}
	c.ackAll(ctx, ack)
}

// record counts each committed command's result and ends its delivery's
// span: a duplicate with its layer, cause (from its arrival) and age, a
// saga stage with its time since the transfer's creation.
func (c *Consumer) record(ctx context.Context, cmds []ledger.Command, spans []trace.Span, arrivals []ledger.Arrival, results []ledger.Result) {
	now := time.Now()
	for i, r := range results {
		sctx := trace.ContextWithSpan(ctx, spans[i])
		if r.Kind == ledger.Duplicate {
			d := ledger.Caught{Topic: cmds[i].Topic(), Layer: r.Layer, Cause: arrivals[i].Cause(), Age: ledger.AgeOf(cmds[i], r, now)}
			c.cfg.Stats.Caught(d)
			dctx := RecordCaught(ctx, spans[i], d)
			if c.cfg.Observe.Duplicate != nil {
				c.cfg.Observe.Duplicate(dctx, d)
			}
		} else {
			c.cfg.Stats.Record(cmds[i].Topic(), r)
		}
		if stage := ledger.SagaStage(cmds[i], r); stage != "" && c.cfg.Observe.Stage != nil {
			c.cfg.Observe.Stage(sctx, stage, now.Sub(cmds[i].CreatedAt))
		}
		endSpan(spans[i], r)
	}
}

// RecordCaught records on span why a duplicate was sent and its age
// (paymesh.dedup.cause, paymesh.dedup.age_ms): what a trace search for a
// region's duplicates reads. It returns the context to record the
// duplicate's metrics with, whose span becomes their trace exemplar: span's,
// or, when the sampler did not record span (a duplicate known only after
// its span started: a new request of a key already applied), a span of its
// own in span's trace, started with the attributes that make
// telemetry.RetrySampler record it, for at most lateSpans a second.
func RecordCaught(ctx context.Context, span trace.Span, d ledger.Caught) context.Context {
	attrs := []attribute.KeyValue{attribute.String("paymesh.dedup.cause", string(d.Cause)), attribute.Int64("paymesh.dedup.age_ms", d.Age.Milliseconds())}
	span.SetAttributes(attrs...)
	ctx = trace.ContextWithSpan(ctx, span)
	if span.IsRecording() || !span.SpanContext().IsValid() || !lateSpans.Allow() {
		return ctx
	}
	ctx, own := tracer.Start(ctx, "duplicate caught", trace.WithAttributes(append(attrs,
		attribute.String(telemetry.AttrDedupOutcome, "duplicate"), attribute.String("paymesh.dedup.layer", string(d.Layer)),
		attribute.String("paymesh.dedup.topic", d.Topic.String()))...))
	own.End()
	return ctx
}

// lateSpans bounds the spans RecordCaught starts, in each process: a
// replay of a stream's every message must not become a span apiece, and
// a duplicate histogram's bucket keeps one exemplar per scrape anyway.
var lateSpans = rate.NewLimiter(10, 10)

// limit is the delivery on which a message that did not apply is
// dead-lettered, with the reason.
type limit struct {
	deliveries int
	reason     string
}

// giveUp returns the limit of a client request (MaxDeliver), a saga step
// whose apply failed (MaxStepDeliver) or a parked saga step
// (MaxParkedDeliver).
func (c *Consumer) giveUp(step, parked bool) limit {
	switch {
	case parked:
		return limit{c.cfg.MaxParkedDeliver, ReasonStepParked}
	case step:
		return limit{c.cfg.MaxStepDeliver, ReasonStepMaxDeliveries}
	}
	return limit{c.cfg.MaxDeliver, ReasonMaxDeliveries}
}

// retryLater leaves a message for redelivery with a growing delay, or on
// its lim-th delivery dead-letters it instead, so that it is never silently
// dropped and cannot hold a place in its shard's MaxAckPending for ever. A
// saga step's limits are generous (its money is in transit and only the
// step can settle it), and a dead-lettered step is replayed by `paymesh dlq
// replay` once what failed it is fixed.
func (c *Consumer) retryLater(ctx context.Context, m jetstream.Msg, cause error, lim limit) {
	md, err := m.Metadata()
	if err == nil && int(md.NumDelivered) >= lim.deliveries {
		c.deadLetter(ctx, m, ledger.Errorf(ledger.Code(lim.reason), "gave up after %d deliveries: %v", md.NumDelivered, cause))
		return
	}
	delay := time.Second
	if err == nil {
		delay = min(time.Duration(md.NumDelivered)*time.Second, c.cfg.AckWait)
	}
	_ = m.NakWithDelay(delay)
}

// ackAll acks committed messages with plain acks: each is one publish on
// the connection, batched by its flusher, with no reply to wait for. A lost
// ack only causes a redelivery, which the layers absorb, so waiting for the
// server's confirmation (DoubleAck, a round trip per message) buys nothing.
func (c *Consumer) ackAll(_ context.Context, msgs []jetstream.Msg) {
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			c.cfg.Log.Warn("ack failed; the message will be redelivered", "err", err)
		}
	}
}

// deadLetter publishes a message to the dead-letter stream with its reason,
// then terminates it. The dead-letter publish is deduplicated by the
// original stream sequence, so a repeat is harmless; if it fails the message
// is left for redelivery instead.
func (c *Consumer) deadLetter(ctx context.Context, m jetstream.Msg, reason error) {
	md, err := m.Metadata()
	if err != nil {
		c.cfg.Log.Error("dead-letter: no metadata", "err", err)
		return
	}
	code := string(ledger.ErrorCode(reason))
	if code == "" {
		code = "internal"
	}
	dup, err := c.publishDLQ(ctx, m.Subject(), m.Data(), md, code, reason.Error())
	if err != nil {
		c.cfg.Log.Error("dead-letter publish failed; leaving the message for redelivery", "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	if !dup {
		c.cfg.Stats.DeadLettered.Add(1)
	}
	if err := m.TermWithReason(code); err != nil {
		c.cfg.Log.Warn("term after dead-letter", "err", err)
	}
}

func (c *Consumer) publishDLQ(ctx context.Context, subject string, data []byte, md *jetstream.MsgMetadata, code, detail string) (duplicate bool, err error) {
	t := c.cfg.Topology
	dl := nats.NewMsg(t.DLQSubject())
	dl.Data = data
	dl.Header.Set(HeaderDLQReason, code)
	dl.Header.Set(HeaderDLQDetail, detail)
	dl.Header.Set(HeaderDLQSubject, subject)
	dl.Header.Set(HeaderDLQSequence, strconv.FormatUint(md.Sequence.Stream, 10))
	dl.Header.Set(HeaderDLQDelivery, strconv.FormatUint(md.NumDelivered, 10))
	dl.Header.Set(HeaderDLQStored, md.Timestamp.UTC().Format(time.RFC3339Nano))
	dl.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("dlq/%s/%d", t.Stream(), md.Sequence.Stream))
	ack, err := c.js.PublishMsg(ctx, dl, jetstream.WithExpectStream(t.DLQStream()))
	if err != nil {
		return false, err
	}
	return ack.Duplicate, nil
}
