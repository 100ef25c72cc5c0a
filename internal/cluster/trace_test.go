package cluster_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/paymesh/paymesh/services/ledger"
)

// TestOneTraceAcrossRegions: a cross-region transfer is one trace, from the
// router's send in eu through the forward, eu's debit, the relayed credit
// step in us and the confirmation back in eu. Each delivery attempt is a
// span with the messaging attributes and the dedup outcome.
func TestOneTraceAcrossRegions(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	h := mustCluster(t, nil, nil)
	h.open(t, 2, 1000)
	h.quiet(t, time.Minute)
	cmd := h.transfer(t, h.accts["eu"][0], h.accts["us"][0], 10)
	if err := h.c.Submit(context.Background(), "eu", cmd); err != nil {
		t.Fatal(err)
	}
	h.quiet(t, time.Minute)
	if got := h.final(t, cmd); got.Status != ledger.StatusCompleted {
		t.Fatalf("transfer: %s", got.Status)
	}

	keys := map[string]bool{cmd.MsgKey(): true, cmd.Step(ledger.TypeCredit, "").MsgKey(): true, cmd.Step(ledger.TypeConfirm, "").MsgKey(): true}
	traces := map[string]bool{}
	processed := map[string]string{} // message key -> region of its process span
	var sends int
	for _, s := range rec.Ended() {
		attrs := map[attribute.Key]string{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value.Emit()
		}
		if !keys[attrs["messaging.message.id"]] {
			continue
		}
		traces[s.SpanContext().TraceID().String()] = true
		switch attrs["messaging.operation.type"] {
		case "process":
			processed[attrs["messaging.message.id"]] = attrs["paymesh.region"]
			if attrs["paymesh.dedup.outcome"] != "first" || attrs["messaging.nats.delivery_count"] != "1" || attrs["messaging.nats.stream_sequence"] == "" {
				t.Errorf("process span %s: attributes %v", s.Name(), attrs)
			}
		case "send":
			sends++
		}
	}
	if len(traces) != 1 {
		t.Fatalf("the transfer's spans are in %d traces, want 1", len(traces))
	}
	want := map[string]string{cmd.MsgKey(): "eu", cmd.Step(ledger.TypeCredit, "").MsgKey(): "us", cmd.Step(ledger.TypeConfirm, "").MsgKey(): "eu"}
	for k, region := range want {
		if processed[k] != region {
			t.Errorf("message %s processed in %q, want %q", k, processed[k], region)
		}
	}
	if sends < 4 { // submit, forward, relay credit, relay confirm
		t.Errorf("send spans: %d, want at least 4", sends)
	}
}
