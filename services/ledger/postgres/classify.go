package postgres

import (
	"bytes"
	"time"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
)

// fateKind is what classify decides for a command.
type fateKind uint8

const (
	// fateApply: the command goes on to plan.
	fateApply fateKind = iota + 1
	// fateDuplicate: the command was processed before; fate.layer caught it.
	fateDuplicate
	// fateConflict: the idempotency key was used for another request.
	fateConflict
	// fateReusedID: the transfer ID belongs to another request (an earlier
	// one, or one earlier in this batch).
	fateReusedID
)

// fate is classify's decision for one command.
type fate struct {
	kind fateKind
	// layer is the layer that caught a duplicate or a conflict.
	layer ledger.Layer
	// first is when a duplicate's key first took effect, as that layer
	// records it; zero when it records no time.
	first time.Time
	// transfer is the transfer a duplicate request made, when it is known:
	// the replay answers with the first outcome.
	transfer ledger.Transfer
	// action is the record a duplicate capture or void made the first
	// time, when it is known: the replay answers with it.
	action *ledger.Action
	// inBatch marks a transfer ID reused by an earlier request of the batch.
	inBatch bool
	// release marks a first claim to give back: its command does not apply,
	// and consume-log rows and applied messages stay one to one.
	release bool
}

// knownTransfers are the transfers that share a business key or an ID with
// a batch's requests.
type knownTransfers struct {
	byKey map[string]ledger.Transfer // by the request key that made them
	byID  map[string]bool
	// promised holds the request keys whose idempotency key already holds
	// an answer naming another transfer (KeyLocker): an earlier attempt
	// that was answered and still waits in a stream.
	promised map[string]bool
	// actions holds the captures and voids recorded under the batch's
	// actions' keys, by request key.
	actions map[string]ledger.Action
}

// classify decides each command's fate from its claim and what the claim
// stage read: the consume-log's duplicates and conflicts (layers 3 and 4),
// then, for first claims, a credit already recorded or a request whose
// business key is known (layer 5), and a transfer ID already used. Saga
// confirm and refuse steps, and requests nothing knows, go on to plan. It
// is pure: no database, no store.
func classify(cmds []ledger.Command, claims []dedup.Claim, known knownTransfers, credited map[string]bool) []fate {
	fates := make([]fate, len(cmds))
	batchIDs := map[string]bool{} // transfer IDs of this batch's first requests
	for i, c := range cmds {
		cl := claims[i]
		switch cl.Outcome {
		case dedup.Duplicate:
			f := fate{kind: fateDuplicate, layer: ledger.Layer(cl.Layer), first: cl.First}
			if cl.Layer == dedup.LayerTable && !c.IsStep() {
				f.transfer = known.byKey[cl.Key.ID] // the stored outcome, for the replay
				if a, ok := known.actions[cl.Key.ID]; ok && c.IsKeyedAction() {
					f.action = &a
				}
			}
			fates[i] = f
			continue
		case dedup.Conflict:
			fates[i] = fate{kind: fateConflict, layer: ledger.Layer(cl.Layer)}
			continue
		}
		switch {
		case c.Type == ledger.TypeCredit && credited[c.TransferID]:
			fates[i] = fate{kind: fateDuplicate, layer: ledger.LayerBusinessKey, release: true}
		case c.IsStep(): // a new credit; confirm, refuse, expire: the state machine decides
			fates[i] = fate{kind: fateApply}
		case c.IsKeyedAction(): // a capture, void or account action: its record is its business key, the state decides
			a, ok := known.actions[cl.Key.ID]
			switch {
			case ok && bytes.Equal(a.Fingerprint, c.Fingerprint()):
				fates[i] = fate{kind: fateDuplicate, layer: ledger.LayerBusinessKey, action: &a, first: a.CreatedAt, release: true}
			case ok:
				fates[i] = fate{kind: fateConflict, layer: ledger.LayerBusinessKey, release: true}
			case known.promised[cl.Key.ID]:
				fates[i] = fate{kind: fateDuplicate, layer: ledger.LayerIdempotencyKey, release: true}
			default:
				fates[i] = fate{kind: fateApply}
			}
		case batchIDs[c.TransferID]:
			fates[i] = fate{kind: fateReusedID, inBatch: true, release: true}
		default:
			batchIDs[c.TransferID] = true
			t, ok := known.byKey[cl.Key.ID]
			switch {
			case ok && bytes.Equal(t.Fingerprint, c.Fingerprint()):
				fates[i] = fate{kind: fateDuplicate, layer: ledger.LayerBusinessKey, transfer: t, first: t.CreatedAt, release: true}
			case ok:
				fates[i] = fate{kind: fateConflict, layer: ledger.LayerBusinessKey, release: true}
			case known.promised[cl.Key.ID]:
				// Another attempt of the key was answered and will apply:
				// this one must not make a second transfer for it.
				fates[i] = fate{kind: fateDuplicate, layer: ledger.LayerIdempotencyKey, release: true}
			case known.byID[c.TransferID]:
				fates[i] = fate{kind: fateReusedID, release: true}
			default:
				fates[i] = fate{kind: fateApply}
			}
		}
	}
	return fates
}

// resultsOf returns the result of every fate but fateApply (plan fills
// those in).
func resultsOf(cmds []ledger.Command, fates []fate) []ledger.Result {
	results := make([]ledger.Result, len(cmds))
	for i, f := range fates {
		results[i] = f.result(cmds[i])
	}
	return results
}

// result is the answer to c of a command whose fate is decided.
func (f fate) result(c ledger.Command) ledger.Result {
	switch f.kind {
	case fateDuplicate:
		r := ledger.Result{Kind: ledger.Duplicate, Layer: f.layer, FirstAt: f.first, Transfer: f.transfer, Action: f.action}
		if f.layer == ledger.LayerConsumeLog && deadLetterReason(f.transfer.Reason) {
			// A refusal that must be dead-lettered is dead-lettered on every
			// delivery, in case an earlier dead-letter publish failed (the
			// dead-letter stream drops the repeats).
			r.DeadLetter = true
			r.Err = ledger.Errorf(f.transfer.Reason, "transfer %s was refused: %s", f.transfer.ID, f.transfer.Reason)
		}
		return r
	case fateConflict:
		// A request the API submitted without claiming its key
		// (KeyExpiresAt) is answered 422 by the API from the key's row:
		// a client's misuse, nothing for an operator, so it is not
		// dead-lettered (the claimed path never submits one).
		return ledger.Result{Kind: ledger.Conflict, Layer: f.layer, DeadLetter: c.KeyExpiresAt.IsZero(),
			Err: ledger.Errorf(ledger.CodeIdempotencyKeyReused, "idempotency key %q of client %q was used for a different request", c.IdempotencyKey, c.ClientID)}
	case fateReusedID:
		err := ledger.Errorf(ledger.CodeTransferIDReused, "transfer id %s already belongs to another request", c.TransferID)
		if f.inBatch {
			err = ledger.Errorf(ledger.CodeTransferIDReused, "transfer id %s already belongs to another request in this batch", c.TransferID)
		}
		return ledger.Result{Kind: ledger.Invalid, DeadLetter: true, Err: err}
	}
	return ledger.Result{}
}

// settledByClaims reports whether the claims leave nothing to write: no
// first claim, and no request the consume-log table caught (the write stage
// stores a replayed request's response).
func settledByClaims(cmds []ledger.Command, claims []dedup.Claim) bool {
	for i, c := range claims {
		if c.Outcome == dedup.First || (c.Outcome == dedup.Duplicate && c.Layer == dedup.LayerTable && !cmds[i].IsStep()) {
			return false
		}
	}
	return true
}

// deadLetterReason reports whether a recorded refusal is one that is
// dead-lettered on every delivery. Releases before the AwaitingAccount
// result recorded a request naming an unknown account as a REJECTED
// transfer; their redeliveries are still dead-lettered, with the reason.
func deadLetterReason(c ledger.Code) bool { return c == ledger.CodeAccountNotFound }
