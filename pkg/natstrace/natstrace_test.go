package natstrace_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/natstrace"
)

// TestTraceParent: a stored traceparent is the W3C value of the context's
// span, and reads back as the same span context.
func TestTraceParent(t *testing.T) {
	if got := natstrace.TraceParent(context.Background()); got != "" {
		t.Fatalf("no span: %q, want empty", got)
	}
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	for flags, want := range map[trace.TraceFlags]string{
		trace.FlagsSampled: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		0:                  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
	} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags})
		got := natstrace.TraceParent(trace.ContextWithSpanContext(context.Background(), sc))
		if got != want {
			t.Errorf("flags %v: %q, want %q", flags, got, want)
		}
		back := trace.SpanContextFromContext(natstrace.WithTraceParent(context.Background(), got))
		if back.TraceID() != tid || back.SpanID() != sid || back.TraceFlags() != flags {
			t.Errorf("flags %v: read back as %v", flags, back)
		}
	}
}
