// Package natstrace carries W3C trace context in NATS message headers (an
// OpenTelemetry TextMapCarrier over nats.Header), and in stored rows as a
// traceparent string, so that one trace follows a transfer through every
// hop and region.
package natstrace

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
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
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c["traceparent"]
}

// WithTraceParent returns ctx carrying a stored traceparent.
func WithTraceParent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}
