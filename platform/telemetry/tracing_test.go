package telemetry_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/platform/telemetry"
)

// TestSetupTracing: without OTEL_* variables nothing is exported; with an
// OTLP endpoint, spans reach it.
func TestSetupTracing(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	if telemetry.TracingEnabled() {
		t.Fatal("tracing enabled without any OTEL_* variable")
	}
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	probe(t, nil)
	if posts.Load() == 0 {
		t.Fatal("no spans reached the OTLP endpoint")
	}
}

// TestRetrySampler: at a ratio of 0 a new trace is not recorded, but a
// redelivery, a publisher's retry, a duplicate caught, a span linked to a recorded one and the
// children of any of them are; at 1 everything is; in between about that
// share of new traces.
func TestRetrySampler(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(telemetry.RetrySampler(0)), sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := tp.Tracer("test")
	ctx := context.Background()
	start := func(ctx context.Context, name string, opts ...trace.SpanStartOption) trace.Span {
		_, span := tr.Start(ctx, name, opts...)
		span.End()
		return span
	}
	first := start(ctx, "first delivery", trace.WithAttributes(attribute.Int64(telemetry.AttrDeliveryCount, 1)))
	again := start(ctx, "redelivery", trace.WithAttributes(attribute.Int64(telemetry.AttrDeliveryCount, 2)))
	retry := start(ctx, "publisher retry", trace.WithAttributes(attribute.Int(telemetry.AttrAttempt, 3)))
	start(ctx, "first publish", trace.WithAttributes(attribute.Int(telemetry.AttrAttempt, 1)))
	start(ctx, "duplicate caught", trace.WithAttributes(attribute.String(telemetry.AttrDedupOutcome, "duplicate")))
	start(ctx, "first effect", trace.WithAttributes(attribute.String(telemetry.AttrDedupOutcome, "first")))
	start(trace.ContextWithSpan(ctx, again), "child of the redelivery")
	start(trace.ContextWithSpan(ctx, first), "child of the first delivery")
	start(ctx, "batch of a redelivery", trace.WithLinks(trace.Link{SpanContext: first.SpanContext()}, trace.Link{SpanContext: retry.SpanContext()}))
	start(ctx, "batch of first deliveries", trace.WithLinks(trace.Link{SpanContext: first.SpanContext()}))

	var got []string
	for _, s := range rec.Ended() {
		got = append(got, s.Name())
	}
	want := []string{"redelivery", "publisher retry", "duplicate caught", "child of the redelivery", "batch of a redelivery"}
	if !slices.Equal(got, want) {
		t.Fatalf("recorded %q, want %q", got, want)
	}

	for _, c := range []struct {
		ratio    float64
		lo, high int
	}{{1, 2000, 2000}, {0.5, 800, 1200}, {0.01, 1, 60}} {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(telemetry.RetrySampler(c.ratio)), sdktrace.WithSpanProcessor(rec))
		for range 2000 {
			_, span := tp.Tracer("test").Start(ctx, "new trace")
			span.End()
		}
		if n := len(rec.Ended()); n < c.lo || n > c.high {
			t.Errorf("ratio %v: %d of 2000 new traces recorded, want %d to %d", c.ratio, n, c.lo, c.high)
		}
		_ = tp.Shutdown(ctx)
	}
}

// TestTraceRatioChecked: a ratio outside 0 to 1 is refused.
func TestTraceRatioChecked(t *testing.T) {
	for _, r := range []float64{0, 0.01, 1} {
		if err := telemetry.CheckTraceRatio(r); err != nil {
			t.Errorf("%v: %v", r, err)
		}
	}
	for _, r := range []float64{-0.1, 1.5, math.NaN(), math.Inf(1)} {
		if err := telemetry.CheckTraceRatio(r); err == nil {
			t.Errorf("%v accepted", r)
		}
	}
}

// TestSamplerVariableWins: SetupTracing's sampler decides unless
// OTEL_TRACES_SAMPLER names one.
func TestSamplerVariableWins(t *testing.T) {
	for _, c := range []struct {
		variable string
		recorded int
	}{{"", 0}, {"always_on", 1}} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.variable)
		rec := tracetest.NewSpanRecorder()
		probe(t, telemetry.RetrySampler(0), rec)
		if n := len(rec.Ended()); n != c.recorded {
			t.Errorf("OTEL_TRACES_SAMPLER=%q: %d spans recorded, want %d", c.variable, n, c.recorded)
		}
	}
}

// probe installs the provider SetupTracing sets up with sampler and procs,
// starts and ends one span, and flushes and stops the provider.
func probe(t *testing.T, sampler sdktrace.Sampler, procs ...sdktrace.SpanProcessor) {
	t.Helper()
	shutdown, err := telemetry.SetupTracing(context.Background(), "paymesh-test", sampler, procs...)
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(context.Background(), "probe")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
