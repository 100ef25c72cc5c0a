package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// Captures, voids and refunds. Each is a client request with an
// Idempotency-Key, run on the unclaimed path (unclaimedPath.submit) in the region
// whose ledger decides it:
//   - a capture or void in the hold's region (its ID's), by the client that
//     made the hold; the command carries the hold's accounts, which the
//     ledger checks against the hold;
//   - a refund in the payee's region, by the client that owns the payee's
//     account: every refund of a transfer debits that account, so that one
//     ledger decides them all, against the refunded amount it keeps. The
//     region that receives the request first asks the transfer's region for
//     its accounts (RefundTarget), then forwards the refund to the payee's.
//
// Anyone else gets 404, as for a transfer that does not exist.

// RefundTarget is what a refund needs of the transfer it refunds: a
// refund call's Target, and the answer of the refund_target operation.
type RefundTarget struct {
	From     string `json:"from"`
	To       string `json:"to"`
	Currency string `json:"currency"`
}

// holds serves the actions on a transfer: capture and void (of a hold),
// refund (of a payment).
type holds struct {
	cfg       *Config
	fwd       *forwarder
	unclaimed *unclaimedPath
	// The operations: a capture or void in the hold's region; a refund's
	// target in the transfer's region, the refund in the payee's.
	capture, void, target, refund operation
}

func newHolds(cfg *Config, fwd *forwarder, unclaimed *unclaimedPath) *holds {
	h := &holds{cfg: cfg, fwd: fwd, unclaimed: unclaimed}
	action := shape{id: idHere, key: requiredKey, body: optionalBody}
	h.capture = operation{name: ledger.TypeCapture, run: h.actHere(ledger.TypeCapture), takes: action}
	h.void = operation{name: ledger.TypeVoid, run: h.actHere(ledger.TypeVoid), takes: action}
	h.target = operation{name: "refund_target", run: h.targetHere, takes: shape{id: idHere}}
	// A refund runs in the payee's region, which its target names; the
	// transfer it refunds may live elsewhere.
	h.refund = operation{name: "create_refund", run: h.refundHere, takes: shape{id: idAny, key: requiredKey, body: optionalBody, target: true}}
	return h
}

func transferNotFound(id string) error {
	return ledger.Errorf(ledger.CodeNotFound, "transfer %s does not exist", id)
}

// postAction serves POST /v1/transfers/{id}/capture and /void: op runs in
// the hold's region.
func (h *holds) postAction(op operation) func(context.Context, *http.Request, string) reply {
	return func(ctx context.Context, r *http.Request, client string) reply {
		c, home, err := h.actionCall(op.name, r, client)
		if err != nil {
			return errReply(err)
		}
		return h.fwd.do(ctx, home, op, c)
	}
}

// actionCall reads a capture, void or refund request (kind: the
// operation's name): its key, its body and the transfer it names, with
// that transfer's region.
func (h *holds) actionCall(kind string, r *http.Request, client string) (Call, string, error) {
	key, err := idempotencyKey(r)
	if err != nil {
		return Call{}, "", err
	}
	body, err := readActionBody(kind, r)
	if err != nil {
		return Call{}, "", err
	}
	id := r.PathValue("id")
	home, err := h.fwd.home(id)
	if err != nil {
		return Call{}, "", transferNotFound(id)
	}
	return Call{Client: client, ID: id, Key: key, Body: body}, home, nil
}

// readActionBody reads and checks the body of a capture, void or refund;
// an empty one (or only white space) is nil.
func readActionBody(kind string, r *http.Request) ([]byte, error) {
	body, err := readBody(r)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil
	}
	if _, err := DecodeActionRequest(kind, body); err != nil {
		return nil, err
	}
	return body, nil
}

// actHere returns the run of a capture or void (typ) in the hold's region.
func (h *holds) actHere(typ string) func(context.Context, Call) reply {
	return func(ctx context.Context, c Call) reply {
		req, err := DecodeActionRequest(typ, c.Body)
		if err != nil {
			return errReply(err)
		}
		if err := validKey(c.Key); err != nil {
			return errReply(err)
		}
		t, err := h.cfg.Ledger.Transfer(ctx, c.ID)
		if err == nil && t.ClientID != c.Client {
			err = transferNotFound(c.ID)
		}
		if err != nil {
			return errReply(err)
		}
		now := h.cfg.Now()
		cmd := ledger.Command{Type: typ, TransferID: t.ID, ClientID: c.Client, IdempotencyKey: c.Key,
			From: t.From, To: t.To, Amount: req.Amount, Currency: t.Currency, CreatedAt: now}
		return h.submit(ctx, c, cmd, t.ID, now)
	}
}

// postRefund serves POST /v1/transfers/{id}/refunds: it learns the
// transfer's accounts from its region, then runs the refund in the payee's.
func (h *holds) postRefund(ctx context.Context, r *http.Request, client string) reply {
	c, home, err := h.actionCall(h.refund.name, r, client)
	if err != nil {
		return errReply(err)
	}
	id := c.ID
	rep := h.fwd.do(ctx, home, h.target, Call{Client: client, ID: id})
	if rep.Status != http.StatusOK {
		return rep
	}
	var target RefundTarget
	if err := json.Unmarshal(rep.Body, &target); err != nil {
		return errReply(err)
	}
	payee, err := h.fwd.home(target.To)
	if err != nil {
		return errReply(transferNotFound(id))
	}
	c.Target = &target
	return h.fwd.do(ctx, payee, h.refund, c)
}

// targetHere answers, in the transfer's region, with its accounts: to the
// API process that forwards the refund, never to a client.
func (h *holds) targetHere(ctx context.Context, c Call) reply {
	t, err := h.cfg.Ledger.Transfer(ctx, c.ID)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, RefundTarget{From: t.From, To: t.To, Currency: t.Currency})
}

// refundHere runs a refund in the payee's region, for the owner of the
// payee's account.
func (h *holds) refundHere(ctx context.Context, c Call) reply {
	req, err := DecodeActionRequest(ledger.TypeRefund, c.Body)
	if err != nil {
		return errReply(err)
	}
	if err := validKey(c.Key); err != nil {
		return errReply(err)
	}
	if c.Target == nil {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "a refund call names its transfer's accounts"))
	}
	if _, err := ownAccount(ctx, h.cfg.Ledger, c.Client, c.Target.To); ledger.ErrorCode(err) == ledger.CodeAccountNotFound {
		return errReply(transferNotFound(c.ID)) // not the payee's owner: as if there were no such transfer
	} else if err != nil {
		return errReply(err)
	}
	id, err := h.cfg.IDs.NextString()
	if err != nil {
		return errReply(err)
	}
	now := h.cfg.Now()
	cmd := ledger.Command{Type: ledger.TypeRefund, TransferID: id, ClientID: c.Client, IdempotencyKey: c.Key,
		From: c.Target.To, To: c.Target.From, Amount: req.Amount, Currency: c.Target.Currency, CreatedAt: now, RefundOf: c.ID}
	return h.submit(ctx, c, cmd, id, now)
}

// submit validates cmd and runs it on the unclaimed path, its key's row
// naming the transfer id.
func (h *holds) submit(ctx context.Context, c Call, cmd ledger.Command, id string, now time.Time) reply {
	if err := cmd.Validate(h.cfg.Region, h.cfg.Regions, now); err != nil {
		return errReply(err)
	}
	return h.unclaimed.submit(ctx, cmd, h.cfg.claim(c.Client, c.Key, RequestFingerprint(cmd), id, now))
}
