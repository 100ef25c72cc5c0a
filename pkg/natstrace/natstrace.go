// Package natstrace carries W3C trace context in NATS message headers (an
// OpenTelemetry TextMapCarrier over nats.Header), and in stored rows as a
// traceparent string, so that one trace follows a transfer through every
// hop and region.
package natstrace

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HeaderCarrier carries W3C trace context in NATS message headers, so that
// one trace follows a transfer through every hop and region.
type HeaderCarrier nats.Header

// Get returns a header's first value.
func (h HeaderCarrier) Get(key string) string { return nats.Header(h).Get(key) }

// Set replaces a header.
func (h HeaderCarrier) Set(key, value string) { nats.Header(h).Set(key, value) }

// Keys lists the header names.
func (h HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

var propagator = propagation.TraceContext{}

// Inject writes ctx's trace context into a message's headers.
func Inject(ctx context.Context, m *nats.Msg) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	propagator.Inject(ctx, HeaderCarrier(m.Header))
}

// Extract returns ctx carrying the trace context of a message's headers.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return propagator.Extract(ctx, HeaderCarrier(h))
}

// TraceParent returns ctx's trace context as a traceparent value ("" when
// there is none), to store with work that continues later (an outbox row).
func TraceParent(ctx context.Context) string {
	var c traceParentCarrier
	propagator.Inject(ctx, &c)
	return c.value
}

// traceParentCarrier keeps the traceparent value alone: TraceParent runs
// for every delivery, and a map per call is garbage for nothing.
type traceParentCarrier struct{ value string }

func (c *traceParentCarrier) Get(string) string { return "" }
func (c *traceParentCarrier) Keys() []string    { return nil }
func (c *traceParentCarrier) Set(key, value string) {
	if key == "traceparent" {
		c.value = value
	}
}

// WithTraceParent returns ctx carrying a stored traceparent.
func WithTraceParent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

// AttemptSpanID derives the span id of a delivery attempt from the trace,
// the stream, the message's stream sequence and the attempt number, so that
// a redelivery, in any process, can link to the first attempt's span.
func AttemptSpanID(traceID trace.TraceID, stream string, seq, attempt uint64) trace.SpanID {
	h := sha256.New()
	h.Write(traceID[:])
	h.Write([]byte(stream))
	_ = binary.Write(h, binary.BigEndian, seq)
	_ = binary.Write(h, binary.BigEndian, attempt)
	var id trace.SpanID
	copy(id[:], h.Sum(nil))
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

type wantedSpanID struct{}

// WithSpanID asks IDGenerator to give the next span started with ctx this
// span id.
func WithSpanID(ctx context.Context, id trace.SpanID) context.Context {
	return context.WithValue(ctx, wantedSpanID{}, id)
}

// IDGenerator is an OpenTelemetry SDK ID generator (sdktrace.WithIDGenerator)
// that gives random IDs, except the span ids asked for with WithSpanID.
// Install it so that delivery attempts get AttemptSpanID and their links
// resolve.
type IDGenerator struct{}

// NewIDs returns a random trace id and span id.
func (IDGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	var t trace.TraceID
	_, _ = rand.Read(t[:])
	return t, IDGenerator{}.NewSpanID(ctx, t)
}

// NewSpanID returns the span id asked for in ctx, or a random one.
func (IDGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if id, ok := ctx.Value(wantedSpanID{}).(trace.SpanID); ok && id.IsValid() {
		return id
	}
	var s trace.SpanID
	for !s.IsValid() {
		_, _ = rand.Read(s[:])
	}
	return s
}
