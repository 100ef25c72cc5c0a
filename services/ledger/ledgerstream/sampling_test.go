package ledgerstream_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/internal/testbed/jsfault"
	"github.com/paymesh/paymesh/internal/testbed/tracerec"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// TestSamplerRecordsRepeats: with the services' sampler at a ratio of 0, a
// first delivery of a first publish leaves no span, but the delivery of a
// publisher's retry (Paymesh-Attempt 2) and a redelivery (its first ack
// lost) are recorded, and so is the batch transaction each one was in:
// the consumer starts its spans with what the sampler decides on. A new
// message of a key already applied, a duplicate known only after its span
// started, gets a span of its own, and its duplicate metric that span. (This
// package's only global tracer provider: tracers bind to the first.)
func TestSamplerRecordsRepeats(t *testing.T) {
	rec := tracerec.Install(telemetry.RetrySampler(0))

	h := mustHarness(t)
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	first, retried, redelivered := h.f.Transfer(t, a, b, 1), h.f.Transfer(t, a, b, 2), h.f.Transfer(t, a, b, 3)
	var dropped atomic.Bool
	js := h.js
	h.js = jsfault.Wrap(js, nil, func(m jetstream.Msg) jetstream.Msg {
		if m.Headers().Get(jetstream.MsgIDHeader) != redelivered.MsgKey() || !dropped.CompareAndSwap(false, true) {
			return m
		}
		return jsfault.DropAck(m, func() bool { return true })
	})
	var exemplars, sampled atomic.Int64
	h.worker(t, h.f.Store, func(c *ledgerstream.ConsumerConfig) {
		c.AckWait = time.Second
		c.Observe.Duplicate = func(ctx context.Context, _ ledger.Caught) {
			exemplars.Add(1)
			if trace.SpanContextFromContext(ctx).IsSampled() {
				sampled.Add(1)
			}
		}
	})
	h.js = js

	if _, err := h.pub.Publish(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	m := h.pub.Msg(retried)
	m.Header.Set(ledgerstream.HeaderAttempt, "2")
	if _, err := h.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	h.drained(t)
	if _, err := h.pub.Publish(context.Background(), redelivered); err != nil {
		t.Fatal(err)
	}
	h.drained(t)
	h.publishRaw(t, first) // a new message of a key already applied: a duplicate known only once looked up
	h.drained(t)
	if !dropped.Load() {
		t.Fatal("no ack was dropped")
	}
	if got := h.f.Balance(t, b); got != 6 {
		t.Fatalf("balance: got %d, want 6", got)
	}

	process := map[string][]string{} // message id -> delivery counts of its recorded spans
	batches, late := 0, 0
	for _, s := range rec.Ended() {
		attrs := tracerec.Attrs(s)
		switch s.Name() {
		case "apply batch":
			batches++
		case "duplicate caught":
			if attrs["paymesh.dedup.cause"] == "" || attrs["paymesh.dedup.layer"] == "" {
				t.Errorf("duplicate caught: attributes %v", attrs)
			}
			late++
		default:
			if attrs["messaging.operation.type"] == "process" {
				id := attrs["messaging.message.id"]
				process[id] = append(process[id], attrs["messaging.nats.delivery_count"])
			}
		}
	}
	if got := process[first.MsgKey()]; len(got) != 0 {
		t.Errorf("first delivery of a first publish recorded: %v", got)
	}
	if got := process[retried.MsgKey()]; len(got) != 1 {
		t.Errorf("delivery of a publisher's retry: %d spans recorded, want 1", len(got))
	}
	if got := process[redelivered.MsgKey()]; len(got) != 1 || got[0] != "2" {
		t.Errorf("redelivered message: spans of delivery counts %v recorded, want [2]", got)
	}
	// The redelivery's duplicate is recorded on its own span; the raw copy
	// of the first gets a span of its own, which its exemplar points at.
	if late != 1 {
		t.Errorf("duplicate caught spans: %d, want 1 (the raw copy's)", late)
	}
	if n, s := exemplars.Load(), sampled.Load(); n != 2 || s != 2 {
		t.Errorf("duplicates observed: %d, %d of them with a recorded span, want 2 and 2", n, s)
	}
	if batches < 2 {
		t.Errorf("batch transactions recorded: %d, want one for the retry's and one for the redelivery's", batches)
	}
}
