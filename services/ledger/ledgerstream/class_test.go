package ledgerstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// TestClassChecked: the ledger applies a command only from its kind's
// class of subject (a fund from the operator's, a saga step from the
// region that sends it, a client command from the client commands') or
// from the region's operator class, which replays any kind. A fund or a
// credit sent as a client command, a credit sent in another region's name
// and an operator's command sent from another region are dead-lettered
// (wrong_class) and move nothing; the same commands on their own classes
// apply.
func TestClassChecked(t *testing.T) {
	h := mustHarness(t)
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	usGen, err := idgen.NewGenerator(h.f.Regions, "us", 77)
	if err != nil {
		t.Fatal(err)
	}
	usID := func() string { s, _ := usGen.NextString(); return s }
	fund := func(key string) ledger.Command {
		return ledger.Command{Type: ledger.TypeFund, TransferID: h.f.ID(t), ClientID: "ops", IdempotencyKey: key,
			To: b, Amount: 1000, Currency: "EUR", CreatedAt: time.Now()}
	}
	credit := func(key string) ledger.Command {
		return ledger.Command{Type: ledger.TypeCredit, TransferID: usID(), ClientID: "c1", IdempotencyKey: key,
			From: usID(), To: b, Amount: 500, Currency: "EUR", CreatedAt: time.Now()}
	}
	on := func(cmd ledger.Command, class subjects.Class, from string) {
		m := nats.NewMsg(h.topo.CommandSubject(cmd, from))
		m.Subject = subjects.LedgerSubject("eu", h.topo.Shard(b), class, from)
		m.Data = cmd.Encode()
		m.Header.Set(jetstream.MsgIDHeader, cmd.MsgKey())
		if _, err := h.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	forged := []struct {
		name  string
		cmd   ledger.Command
		class subjects.Class
		from  string
	}{
		{"FundAsClientCommand", fund("forged-fund"), subjects.ClassCommand, "eu"},
		{"CreditAsClientCommand", credit("forged-credit"), subjects.ClassCommand, "us"},
		{"CreditInAnotherRegionsName", credit("forged-step"), subjects.ClassStep, "ap"},
		{"FundFromAnotherRegionsOperator", fund("forged-ops"), subjects.ClassOps, "us"},
		{"TransferAsStep", h.f.Transfer(t, a, b, 5), subjects.ClassStep, "eu"},
	}
	for _, f := range forged {
		on(f.cmd, f.class, f.from)
	}
	on(fund("real-fund"), subjects.ClassOps, "eu")
	on(h.f.Transfer(t, a, b, 7), subjects.ClassCommand, "eu")
	on(h.f.Transfer(t, a, b, 3), subjects.ClassOps, "eu") // a dead letter replayed by the operator

	h.worker(t, h.f.Store, nil)
	h.drained(t)

	if got := h.f.Balance(t, b); got != 1000+7+3 {
		t.Errorf("b: got %d, want %d: the real fund and the two transfers, nothing forged", got, 1000+7+3)
	}
	wrong := map[string]bool{}
	for _, m := range h.dlq(t) {
		if m.Header.Get(ledgerstream.HeaderDLQReason) == ledgerstream.ReasonWrongClass {
			cmd, err := ledger.DecodeCommand(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			wrong[cmd.IdempotencyKey] = true
		} else {
			t.Errorf("dead letter %s: %s", m.Header.Get(ledgerstream.HeaderDLQReason), m.Header.Get(ledgerstream.HeaderDLQDetail))
		}
	}
	for _, f := range forged {
		if !wrong[f.cmd.IdempotencyKey] {
			t.Errorf("%s: not dead-lettered as %s", f.name, ledgerstream.ReasonWrongClass)
		}
	}
	h.f.MustVerify(t)
}
