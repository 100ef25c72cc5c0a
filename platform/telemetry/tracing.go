package telemetry

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/natstrace"
)

// TracingEnabled reports whether the standard OTEL_* variables ask for an
// OTLP trace exporter.
func TracingEnabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" ||
		os.Getenv("OTEL_TRACES_EXPORTER") == "otlp"
}

// SetupTracing installs the global tracer provider when the OTEL_*
// variables ask for OTLP export (endpoint, headers, sampler and resource all
// come from those variables), or when in-process processors are given (the
// demo's live page records spans). Without either nothing is installed, the
// global provider stays a no-op and tracing costs next to nothing. sampler
// decides which spans are recorded unless OTEL_TRACES_SAMPLER names one;
// nil leaves it to the SDK (every span, unless the variable says
// otherwise). The returned function flushes and stops the provider.
func SetupTracing(ctx context.Context, service string, sampler sdktrace.Sampler, procs ...sdktrace.SpanProcessor) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !TracingEnabled() && len(procs) == 0 {
		return func(context.Context) error { return nil }, nil
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithIDGenerator(natstrace.IDGenerator{})}
	if sampler != nil && os.Getenv("OTEL_TRACES_SAMPLER") == "" {
		opts = append(opts, sdktrace.WithSampler(sampler))
	}
	if TracingEnabled() {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: otlp exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	for _, p := range procs {
		opts = append(opts, sdktrace.WithSpanProcessor(p))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		res = resource.Default()
	}
	if os.Getenv("OTEL_SERVICE_NAME") != "" {
		res = resource.Default() // the variable names the service
	}
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// DefaultTraceRatio is the share of new traces the services record when
// the OTEL_* variables name no sampler: one in a hundred. Every retry and
// redelivery is recorded whatever the ratio (RetrySampler).
const DefaultTraceRatio = 0.01

// Span attributes that RetrySampler records a span for when it starts
// with them: a delivery after the first, a publish after the first (above
// 1), a duplicate caught ("duplicate").
const (
	AttrDeliveryCount = "messaging.nats.delivery_count"
	AttrAttempt       = "paymesh.attempt"
	AttrDedupOutcome  = "paymesh.dedup.outcome"
)

// CheckTraceRatio returns an error unless ratio is a share, 0 to 1.
func CheckTraceRatio(ratio float64) error {
	if !(ratio >= 0 && ratio <= 1) {
		return fmt.Errorf("trace ratio %v: want a share from 0 to 1", ratio)
	}
	return nil
}

// RetrySampler returns the services' sampler: a span is recorded when it
// starts as a repeated attempt (AttrDeliveryCount or AttrAttempt above 1)
// or as a duplicate caught (AttrDedupOutcome), when one of its links is to
// a recorded span (a batch's transaction and any of its deliveries; a retry
// and its first attempt), or when its parent is; a trace that none of these
// starts is recorded with probability ratio, decided on its trace id so
// that every process agrees. Retries, redeliveries and duplicates are rare
// and are what a trace is read for; a span for every first delivery costs
// CPU on every message (docs/BENCHMARKS.md, "The services' sampler").
func RetrySampler(ratio float64) sdktrace.Sampler {
	return retrySampler{base: sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))}
}

type retrySampler struct{ base sdktrace.Sampler }

func (s retrySampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if repeated(p) {
		return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample,
			Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	}
	return s.base.ShouldSample(p)
}

func (s retrySampler) Description() string {
	return fmt.Sprintf("RetrySampler{retries, redeliveries, duplicates, sampled links, else %s}", s.base.Description())
}

// repeated reports whether the span starts as a repeated attempt or a
// duplicate caught, or links to a recorded span.
func repeated(p sdktrace.SamplingParameters) bool {
	for _, a := range p.Attributes {
		if (a.Key == AttrDeliveryCount || a.Key == AttrAttempt) && a.Value.AsInt64() > 1 ||
			a.Key == AttrDedupOutcome && a.Value.AsString() == "duplicate" {
			return true
		}
	}
	for _, l := range p.Links {
		if l.SpanContext.IsSampled() {
			return true
		}
	}
	return false
}
