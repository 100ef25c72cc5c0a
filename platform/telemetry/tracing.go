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
// global provider stays a no-op and tracing costs next to nothing. The
// returned function flushes and stops the provider.
func SetupTracing(ctx context.Context, service string, procs ...sdktrace.SpanProcessor) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !TracingEnabled() && len(procs) == 0 {
		return func(context.Context) error { return nil }, nil
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithIDGenerator(natstrace.IDGenerator{})}
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
