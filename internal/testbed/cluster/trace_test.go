package cluster_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/paymesh/paymesh/internal/testbed/tracerec"
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
	recOnce.Do(func() { rec = tracerec.Install(nil) })
	return rec
}

// TestRetriesAcrossRegionsInOneTrace: a cross-region transfer with an
// injected producer retry (every forward and saga step published twice with
// the same Nats-Msg-Id) and an injected redelivery (the acks of eu's debit
// dropped after commit) is one trace: from the router's send in us (the
// request came in there; one homed in the submitting region skips the
// forward) through the forward, eu's debit and its redelivery, the credit step in us
// and the confirmation back in eu. Each delivery attempt is a span with the
// messaging attributes; the redelivery links to its first attempt (which
// exists, thanks to the derived span ids) and names the layer that caught
// it; the retried publishes (the forward, and the ledgers' sends of the
// two steps) carry the msg_id layer.
func TestRetriesAcrossRegionsInOneTrace(t *testing.T) {
	rec := recorder()

	var inject, drop atomic.Bool
	h := mustCluster(t, inject.Load, func() bool { return drop.CompareAndSwap(true, false) })
	h.open(t, 2, 1000)
	h.quiet(t, time.Minute)
	inject.Store(true)
	drop.Store(true)
	cmd := h.transfer(t, h.accts["eu"][0], h.accts["us"][0], 10)
	if err := h.c.Submit(context.Background(), "us", cmd); err != nil {
		t.Fatal(err)
	}
	h.quiet(t, time.Minute)
	if got := h.final(t, cmd); got.Status != ledger.StatusCompleted {
		t.Fatalf("transfer: %s", got.Status)
	}
	if drop.Load() {
		t.Fatal("no ack was dropped")
	}

	debit, credit, confirm := cmd.MsgKey(), cmd.Step(ledger.TypeCredit, "").MsgKey(), cmd.Step(ledger.TypeConfirm, "").MsgKey()
	keys := map[string]bool{debit: true, credit: true, confirm: true}
	traces := map[string]bool{}
	byID := map[string]sdktrace.ReadOnlySpan{}
	firstProcess := map[string]string{} // message key -> region of its first delivery
	var sends, retriedPublishes int
	var redelivery sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		attrs := tracerec.Attrs(s)
		if !keys[attrs["messaging.message.id"]] {
			continue
		}
		byID[s.SpanContext().SpanID().String()] = s
		traces[s.SpanContext().TraceID().String()] = true
		switch attrs["messaging.operation.type"] {
		case "process":
			if attrs["messaging.nats.stream_sequence"] == "" || attrs["messaging.system"] != "nats" || attrs["messaging.destination.name"] == "" {
				t.Errorf("process span %s: attributes %v", s.Name(), attrs)
			}
			if attrs["messaging.nats.delivery_count"] == "1" {
				firstProcess[attrs["messaging.message.id"]] = attrs["paymesh.region"]
				if attrs["paymesh.dedup.outcome"] != "first" {
					t.Errorf("first delivery of %s: outcome %q", attrs["messaging.message.id"], attrs["paymesh.dedup.outcome"])
				}
			} else if attrs["messaging.message.id"] == debit {
				redelivery = s
			}
		case "send":
			sends++
			if attrs["paymesh.dedup.outcome"] == "duplicate" && attrs["paymesh.dedup.layer"] == "msg_id" {
				retriedPublishes++
			}
		}
	}
	if len(traces) != 1 {
		t.Fatalf("the transfer's spans are in %d traces, want 1", len(traces))
	}
	want := map[string]string{debit: "eu", credit: "us", confirm: "eu"}
	for k, region := range want {
		if firstProcess[k] != region {
			t.Errorf("message %s first processed in %q, want %q", k, firstProcess[k], region)
		}
	}
	if sends < 4 { // submit, forward, the credit step, the confirm step
		t.Errorf("send spans: %d, want at least 4", sends)
	}
	if retriedPublishes < 3 { // forward, credit step, confirm step: each published twice
		t.Errorf("publishes marked as duplicates caught by msg_id: %d, want at least 3", retriedPublishes)
	}

	if redelivery == nil {
		t.Fatal("no span for the redelivery of the debit")
	}
	attrs := tracerec.Attrs(redelivery)
	if attrs["paymesh.dedup.outcome"] != "duplicate" || attrs["paymesh.dedup.layer"] == "" {
		t.Errorf("redelivery span: outcome %q layer %q", attrs["paymesh.dedup.outcome"], attrs["paymesh.dedup.layer"])
	}
	linked := false
	for _, l := range redelivery.Links() {
		first, ok := byID[l.SpanContext.SpanID().String()]
		if ok && l.SpanContext.TraceID() == redelivery.SpanContext().TraceID() && tracerec.Attrs(first)["messaging.nats.delivery_count"] == "1" {
			linked = true
		}
	}
	if !linked {
		t.Errorf("the redelivery does not link to its first attempt: links %v", redelivery.Links())
	}
}
