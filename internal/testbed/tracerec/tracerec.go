// Package tracerec records the spans of a test process: a global tracer
// provider with paymesh's ID generator and a sampler of the test's
// choosing, and the recorded spans' attributes.
package tracerec

import (
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/paymesh/paymesh/pkg/natstrace"
)

// Install sets as the global tracer provider one that records the spans
// sampler samples (nil: every span) into the returned recorder, with
// natstrace.IDGenerator, as the services' provider has it. Tracers bind
// to the first global provider set, so a test process installs one.
func Install(sampler sdktrace.Sampler) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(natstrace.IDGenerator{})}
	if sampler != nil {
		opts = append(opts, sdktrace.WithSampler(sampler))
	}
	otel.SetTracerProvider(sdktrace.NewTracerProvider(opts...))
	return rec
}

// Attrs returns span s's attributes by key, each value as a string.
func Attrs(s sdktrace.ReadOnlySpan) map[string]string {
	attrs := map[string]string{}
	for _, a := range s.Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	return attrs
}
