package cluster_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/services/ledger"
)

var (
	recOnce sync.Once
	rec     *tracetest.SpanRecorder
)

// recorder installs, once per test process, a tracer provider that records
// every span, with paymesh's ID generator. Tracers bind to the first global
// provider set, so the tests share this one and tell their spans apart by
// message ids.
func recorder() *tracetest.SpanRecorder {
	recOnce.Do(func() {
		rec = tracetest.NewSpanRecorder()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(natstrace.IDGenerator{})))
	})
	return rec
}

// TestOneTraceAcrossRegions: a cross-region transfer is one trace, from the
// router's send in eu through the forward, eu's debit, the relayed credit
// step in us and the confirmation back in eu. Each delivery attempt is a
// span with the messaging attributes and the dedup outcome.
func TestOneTraceAcrossRegions(t *testing.T) {
	rec := recorder()

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

// TestRedeliveryLinksToFirstAttempt: a delivery whose ack was dropped comes
// back; its span links to the first attempt's span (which exists, thanks to
// the derived span ids) and says which layer caught the duplicate.
func TestRedeliveryLinksToFirstAttempt(t *testing.T) {
	rec := recorder()

	var dropped atomic.Int64
	h := mustCluster(t, nil, func() bool { return dropped.Add(1) == 1 }) // the first batch: the funding
	h.open(t, 1, 1000)
	h.quiet(t, time.Minute)
	if dropped.Load() == 0 {
		t.Fatal("no ack was dropped")
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.SpanContext().SpanID().String()] = s
	}
	var linked int
	for _, s := range rec.Ended() {
		attrs := map[attribute.Key]string{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value.Emit()
		}
		if attrs["messaging.operation.type"] != "process" || attrs["messaging.nats.delivery_count"] == "1" {
			continue
		}
		if attrs["paymesh.dedup.outcome"] != "duplicate" || attrs["paymesh.dedup.layer"] == "" {
			t.Errorf("redelivery span: outcome %q layer %q", attrs["paymesh.dedup.outcome"], attrs["paymesh.dedup.layer"])
		}
		for _, l := range s.Links() {
			first, ok := spans[l.SpanContext.SpanID().String()]
			if ok && l.SpanContext.TraceID() == s.SpanContext().TraceID() && first.Name() == s.Name() {
				linked++
			}
		}
	}
	if linked == 0 {
		t.Fatal("no redelivery span links to its first attempt")
	}
}
