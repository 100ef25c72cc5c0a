// Package router routes transfer commands to the home region of their
// source account and relays each region's transactional outbox.
//
// Subjects and streams of region <r>:
//
//	route.<r>.<home>.<shard>   ROUTE_<R>: commands accepted in <r> for accounts
//	                           homed in <home>, stored here first
//	ledger.<home>.<shard>      the home region's ledger stream (see
//	                           services/ledger/ledgerstream)
//
// Store and forward: Submit stores a command in the local ROUTE stream (a
// work queue), which succeeds while other regions are unreachable. The
// forwarder, with one durable consumer per home region, then
// publishes it to the home region's ledger stream with the same Nats-Msg-Id
// on every attempt, and acks the local copy only after the home stream
// acked. Failed forwards are retried with backoff, forever: a command is
// never dropped.
//
// The relay reads the ledger's outbox table and publishes each saga step to
// the ledger stream of the region that applies it, with the step's
// Nats-Msg-Id; a row is marked sent only after the PubAck.
package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// Stream is the name of a region's route stream.
func Stream(region string) string { return subjects.RouteStream(region) }

// EnsureStream creates or updates the region's route stream (file storage,
// a Nats-Msg-Id window of window, replicas replicas, at most limits; 0 for
// any takes the default: ledgerstream.DefaultDuplicateWindow, one replica,
// ledgerstream.DefaultLimits). It is a work queue: a command stays, with no
// age limit, until the forwarder acks it after the home region acked, then
// it is removed. A full stream refuses the next submit (Submit returns the
// error) rather than drop a command it acknowledged. It is idempotent, and
// updates an existing stream to this configuration (its replica count
// included). It returns an error for a replica count
// ledgerstream.CheckReplicas refuses or limits ledgerstream.CheckLimits
// refuses, and JetStream's errors.
func EnsureStream(ctx context.Context, js jetstream.JetStream, region string, window time.Duration, replicas int, limits ledgerstream.Limits) error {
	if window <= 0 {
		window = ledgerstream.DefaultDuplicateWindow
	}
	if replicas == 0 {
		replicas = 1
	}
	err := ledgerstream.CheckReplicas(replicas)
	if err == nil {
		err = ledgerstream.CheckLimits(limits)
	}
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", Stream(region), err)
	}
	_, err = js.CreateOrUpdateStream(ctx, limits.Or(ledgerstream.DefaultLimits).Apply(jetstream.StreamConfig{
		Name:        Stream(region),
		Description: "commands accepted in region " + region + ", stored until their home region acked them",
		Subjects:    []string{subjects.Route(region)},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.WorkQueuePolicy,
		Duplicates:  window,
		Replicas:    replicas,
	}))
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", Stream(region), err)
	}
	return nil
}

// Config configures a region's router.
type Config struct {
	Region  string
	Regions *idgen.Regions
	// Shards must match the ledgers' shard count.
	Shards int
	// AckWait is how long a forward may take before the route stream hands
	// the command out again (default 10 s); a publish waits at most half of
	// it for its PubAck. A forwarder that crashed mid-batch delays its
	// commands by this much.
	AckWait time.Duration
	// Stats, if set, receives the router's counters; a new one is made
	// otherwise.
	Stats *Stats
	// AnswerTo, if set, is the subject of the process that submits
	// through this router (an API's, subjects.Answers): Submit sends it
	// with each client request (ledgerstream.HeaderAnswerTo), and the ledger tells
	// that subject when the request is answered.
	AnswerTo string
	// Observe, if set, is told each duplicate JetStream's Nats-Msg-Id
	// window caught (its stage, cause and age), with the publish's span.
	Observe func(ctx context.Context, stage Stage, c ledger.Caught)
}

// Router submits commands into the local route stream.
type Router struct {
	cfg Config
	js  jetstream.JetStream
}

// NewJetStream returns the JetStream handle a router needs on conn: async
// publishes time out, so a lost PubAck cannot pile up pending futures.
func NewJetStream(nc *nats.Conn, ackWait time.Duration) (jetstream.JetStream, error) {
	if ackWait <= 0 {
		ackWait = defaultAckWait
	}
	return jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackWait/2))
}

const defaultAckWait = 10 * time.Second

// New returns a router on a JetStream handle from NewJetStream.
func New(js jetstream.JetStream, cfg Config) *Router {
	if cfg.Stats == nil {
		cfg.Stats = &Stats{}
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = defaultAckWait
	}
	return &Router{cfg: cfg, js: js}
}

// Stats returns the router's counters.
func (r *Router) Stats() *Stats { return r.cfg.Stats }

// home returns the region whose ledger applies cmd and the account whose
// shard carries it.
func (r *Router) home(cmd ledger.Command) (region, account string, err error) {
	account = cmd.Account()
	region, err = r.cfg.Regions.HomeRegion(account)
	if err != nil {
		return "", "", ledger.Errorf(ledger.CodeInvalidRequest, "cannot route %s: %v", cmd.MsgKey(), err)
	}
	return region, account, nil
}

func (r *Router) topo(region string) ledgerstream.Topology {
	return ledgerstream.Topology{Region: region, Shards: r.cfg.Shards}
}

// Submit stores a command in the local route stream, addressed to its home
// region, or, when its home is this region, straight in this region's
// ledger stream: a hop less for the API's own transfers, with the same
// Nats-Msg-Id, which the ledger stream's window deduplicates as the route
// stream's would (a copy that still came through the route stream is
// caught by it too). It falls back to the route stream while the ledger
// stream does not exist yet (a ledger that never started). It succeeds
// while the home region is unreachable. It reports whether the stream
// recognised the command as a duplicate (same Nats-Msg-Id within the
// window), and returns an error for a command that cannot be routed or
// when the local stream did not ack.
func (r *Router) Submit(ctx context.Context, cmd ledger.Command) (duplicate bool, err error) {
	home, account, err := r.home(cmd)
	if err != nil {
		return false, err
	}
	shard := r.topo(home).Shard(account)
	if home == r.cfg.Region {
		dup, err := r.submit(ctx, cmd, subjects.LedgerSubject(home, shard, ledgerstream.ClassOf(cmd), r.cfg.Region), subjects.LedgerStream(home))
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			if err == nil {
				r.cfg.Stats.Direct.Add(1)
			}
			return dup, err
		}
	}
	return r.submit(ctx, cmd, subjects.RouteShard(r.cfg.Region, home, shard), Stream(r.cfg.Region))
}

// submit publishes cmd to subject, which must land in stream, and waits for
// its PubAck.
func (r *Router) submit(ctx context.Context, cmd ledger.Command, subject, stream string) (duplicate bool, err error) {
	m := nats.NewMsg(subject)
	m.Data = cmd.Encode()
	m.Header.Set(jetstream.MsgIDHeader, cmd.MsgKey())
	m.Header.Set(ledgerstream.HeaderAttempt, "1") // a client that submits again is a new request
	if r.cfg.AnswerTo != "" && !cmd.IsStep() {
		m.Header.Set(ledgerstream.HeaderAnswerTo, r.cfg.AnswerTo)
	}
	ctx, span := tracer.Start(ctx, "send "+m.Subject, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		ledgerstream.Messaging(r.cfg.Region, m.Subject, cmd.MsgKey(), "send")...))
	defer span.End()
	natstrace.Inject(ctx, m)
	ack, err := r.js.PublishMsg(ctx, m, jetstream.WithExpectStream(stream))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return false, fmt.Errorf("submit %s: %w", cmd.MsgKey(), err)
	}
	r.cfg.Stats.Submitted.Add(1)
	if ack.Duplicate {
		span.SetAttributes(attribute.String("paymesh.dedup.outcome", "duplicate"), attribute.String("paymesh.dedup.layer", "msg_id"))
		r.caught(ctx, StageSubmit, m, cmd)
	}
	return ack.Duplicate, nil
}

// caught counts a duplicate that JetStream's Nats-Msg-Id window caught at
// stage: m is the copy it caught, whose attempt header tells the
// publisher's retry from a new request, cmd its command. Its age runs from
// the request's creation (the window keeps no time of the first copy).
// ctx holds the publish's span, which records the cause and age.
func (r *Router) caught(ctx context.Context, stage Stage, m *nats.Msg, cmd ledger.Command) {
	c := ledgerstream.CaughtAtMsgID(cmd, m)
	r.cfg.Stats.caught(stage, c.Cause)
	ctx = ledgerstream.RecordCaught(ctx, trace.SpanFromContext(ctx), c)
	if r.cfg.Observe != nil {
		r.cfg.Observe(ctx, stage, c)
	}
}

var tracer = otel.Tracer("github.com/paymesh/paymesh/services/router")
