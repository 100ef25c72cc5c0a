package ledgerstream_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// poisonStep applies through the store, except that an apply holding the
// step whose key it names always fails, as for a step that breaks every
// transaction it is in.
type poisonStep struct {
	ledgerstream.Applier
	key   string
	tries atomic.Int64 // applies of the step alone
}

func (p *poisonStep) Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	for _, c := range cmds {
		if c.MsgKey() == p.key {
			if len(cmds) == 1 {
				p.tries.Add(1)
			}
			return nil, errors.New("poison: the step breaks its transaction")
		}
	}
	return p.Applier.Apply(ctx, cmds)
}

// crossRegion applies, in eu, a transfer from a new eu account to an
// account homed in us: DEBITED, waiting for its confirm step.
func (h *harness) crossRegion(tb testing.TB) ledger.Command {
	tb.Helper()
	us, err := idgen.NewGenerator(h.f.Regions, "us", 9)
	if err != nil {
		tb.Fatal(err)
	}
	dest, err := us.NextString()
	if err != nil {
		tb.Fatal(err)
	}
	tr := h.f.Transfer(tb, h.f.Account(tb, "EUR", 100), dest, 10)
	if r := h.f.MustApply(tb, tr); r.Kind != ledger.Applied {
		tb.Fatalf("cross-region transfer: got %v, want applied", r.Kind)
	}
	return tr
}

// waitLetters waits until the dead-letter stream holds n letters.
func (h *harness) waitLetters(tb testing.TB, n int, within time.Duration) {
	tb.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		if got := len(h.dlq(tb)); got >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("fewer than %d dead letters after %s", n, within)
		}
	}
}

// TestPoisonStepDeadLettered: a saga step whose apply always fails is
// retried past MaxDeliver (a client request's limit) and dead-lettered on
// its MaxStepDeliver-th delivery with ReasonStepMaxDeliveries, counted as a
// dead letter; the commands around it apply.
func TestPoisonStepDeadLettered(t *testing.T) {
	h := mustHarness(t)
	tr := h.crossRegion(t)
	step := tr.Step(ledger.TypeConfirm, "")
	app := &poisonStep{Applier: h.f.Store, key: step.MsgKey()}
	h.worker(t, app, func(c *ledgerstream.ConsumerConfig) {
		c.MaxDeliver, c.MaxStepDeliver, c.AckWait = 2, 4, time.Second
	})
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	for _, cmd := range []ledger.Command{step, h.f.Transfer(t, a, b, 7)} {
		if _, err := h.pub.Publish(context.Background(), cmd); err != nil {
			t.Fatal(err)
		}
	}
	h.waitLetters(t, 1, 30*time.Second)
	h.drained(t)
	dl := h.dlq(t)
	if len(dl) != 1 || dl[0].Header.Get(ledgerstream.HeaderDLQReason) != ledgerstream.ReasonStepMaxDeliveries ||
		dl[0].Header.Get(ledgerstream.HeaderDLQDelivery) != "4" {
		t.Fatalf("dead letters: got %d (%v), want 1 with reason %s on delivery 4", len(dl), dl[0].Header, ledgerstream.ReasonStepMaxDeliveries)
	}
	if got := app.tries.Load(); got != 4 {
		t.Fatalf("applies of the step: got %d, want 4 (dead-lettered on its 4th delivery, not before)", got)
	}
	if got := h.f.Stats.DeadLettered.Load(); got != 1 {
		t.Fatalf("dead-lettered: got %d, want 1", got)
	}
	if got := h.f.Balance(t, b); got != 7 {
		t.Fatalf("the transfer beside the step: got %d, want 7", got)
	}
	if got, err := h.f.Store.Transfer(context.Background(), tr.TransferID); err != nil || got.Status != ledger.StatusDebited {
		t.Fatalf("transfer of the dead-lettered step: got %v %v, want still DEBITED", got.Status, err)
	}
}

// TestParkedStepDeadLettered: a saga step that stays ahead of its state (a
// confirm for a transfer this region never had) is parked on every
// delivery, and dead-lettered on its MaxParkedDeliver-th with
// ReasonStepParked, not on the lower MaxStepDeliver.
func TestParkedStepDeadLettered(t *testing.T) {
	h := mustHarness(t)
	a := h.f.Account(t, "EUR", 100)
	step := h.f.Transfer(t, a, h.crossRegion(t).To, 10).Step(ledger.TypeConfirm, "") // never applied here
	h.worker(t, h.f.Store, func(c *ledgerstream.ConsumerConfig) {
		c.MaxStepDeliver, c.MaxParkedDeliver, c.AckWait = 2, 3, time.Second
	})
	if _, err := h.pub.Publish(context.Background(), step); err != nil {
		t.Fatal(err)
	}
	h.waitLetters(t, 1, 30*time.Second)
	dl := h.dlq(t)
	if len(dl) != 1 || dl[0].Header.Get(ledgerstream.HeaderDLQReason) != ledgerstream.ReasonStepParked ||
		dl[0].Header.Get(ledgerstream.HeaderDLQDelivery) != "3" {
		t.Fatalf("dead letters: got %d (%v), want 1 with reason %s on delivery 3", len(dl), dl[0].Header, ledgerstream.ReasonStepParked)
	}
	if got := h.f.Stats.Parked.Load(); got != 3 {
		t.Fatalf("parked: got %d, want 3", got)
	}
}

// TestFullDLQKeepsStep: while the dead-letter stream is at its bound, a
// poison step that used up its deliveries cannot be dead-lettered: it is
// not acked, stays in the ledger stream and comes again; once the bound is
// raised it is dead-lettered, and nothing was lost.
func TestFullDLQKeepsStep(t *testing.T) {
	topo := ledgerstream.Topology{Region: "eu", Shards: 4, DLQLimits: ledgerstream.Limits{MaxMsgs: 1}}
	h := mustHarnessTopo(t, topo)
	tr := h.crossRegion(t)
	step := tr.Step(ledger.TypeConfirm, "")
	app := &poisonStep{Applier: h.f.Store, key: step.MsgKey()}
	h.worker(t, app, func(c *ledgerstream.ConsumerConfig) { c.MaxStepDeliver, c.AckWait = 2, time.Second })
	h.publishData(t, subjects.LedgerSubject(topo.Region, 0, subjects.ClassCommand, topo.Region), []byte("not a command")) // fills the dead-letter stream
	h.waitLetters(t, 1, 30*time.Second)
	if _, err := h.pub.Publish(context.Background(), step); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); app.tries.Load() < 4; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("applies of the step: got %d after 30s, want 4 (delivered again after its dead letter was refused)", app.tries.Load())
		}
	}
	if got := len(h.dlq(t)); got != 1 {
		t.Fatalf("dead letters while the stream is full: got %d, want 1", got)
	}
	if n, err := ledgerstream.Backlog(context.Background(), h.js, topo); err != nil || n != 1 {
		t.Fatalf("backlog while the dead-letter stream is full: got %d, %v; want the step, unacked", n, err)
	}
	if got := h.f.Stats.DeadLettered.Load(); got != 1 {
		t.Fatalf("dead-lettered while the stream is full: got %d, want 1 (the refused one is not counted)", got)
	}
	topo.DLQLimits.MaxMsgs = 10
	if err := ledgerstream.EnsureStreams(context.Background(), h.js, topo); err != nil {
		t.Fatal(err)
	}
	h.waitLetters(t, 2, 30*time.Second)
	h.drained(t)
	if dl := h.dlq(t); dl[1].Header.Get(ledgerstream.HeaderDLQReason) != ledgerstream.ReasonStepMaxDeliveries {
		t.Fatalf("the step's dead letter: got reason %q, want %s", dl[1].Header.Get(ledgerstream.HeaderDLQReason), ledgerstream.ReasonStepMaxDeliveries)
	}
}
