package ledgerstream

import (
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
)

// ReasonWrongClass is the dead-letter reason of a command that arrived on
// a ledger subject its kind never travels on: a fund or a saga step sent
// as a client command, a step sent from a region that does not send it.
// The servers' permissions give each class only to its own publishers, so
// such a command was forged with a credential that may publish the class
// it came on, or sent by a service with a bug.
const ReasonWrongClass = "wrong_class"

// ClassOf is the class of ledger subject a command's kind travels on: a
// fund the operator's, a saga step its own, a client command the client
// commands'.
func ClassOf(c ledger.Command) subjects.Class {
	switch {
	case c.Type == ledger.TypeFund:
		return subjects.ClassOps
	case c.IsStep():
		return subjects.ClassStep
	}
	return subjects.ClassCommand
}

// CheckClass returns an *ledger.Error with ReasonWrongClass unless cmd, a
// valid command, arrived on a subject of its kind's class (a saga step:
// sent from the region that sends it), or on the region's operator class,
// which replays every kind of dead letter. It runs on every delivery,
// before the command is applied.
func CheckClass(subject string, cmd ledger.Command, ids *idgen.Regions) error {
	addr, err := subjects.ParseLedger(subject)
	if err != nil {
		return ledger.Errorf(ReasonWrongClass, "%v", err)
	}
	want := ClassOf(cmd)
	switch {
	case addr.Class == subjects.ClassOps && addr.From != addr.Region:
		return ledger.Errorf(ReasonWrongClass, "the operator's commands are sent from the ledger's own region, not from %s (%s)", addr.From, subject)
	case addr.Class == subjects.ClassOps:
		return nil // the operator's: a fund, or a dead letter replayed
	case addr.Class != want:
		return ledger.Errorf(ReasonWrongClass, "a %s travels on the %s class, not on %s", cmd.Type, want, subject)
	case want == subjects.ClassStep:
		from, err := cmd.SentFrom(ids)
		if err != nil {
			return err
		}
		if from != addr.From {
			return ledger.Errorf(ReasonWrongClass, "a %s of transfer %s is sent from region %s, not from %s (%s)",
				cmd.Type, cmd.TransferID, from, addr.From, subject)
		}
	}
	return nil
}
