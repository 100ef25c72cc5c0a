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
// Idempotency-Key, run on the unclaimed path (submitUnclaimed) in the region
// whose ledger decides it:
//   - a capture or void in the hold's region (its ID's), by the client that
//     made the hold; the command carries the hold's accounts, which the
//     ledger checks against the hold;
//   - a refund in the payee's region, by the client that owns the payee's
//     account: every refund of a transfer debits that account, so that one
//     ledger decides them all, against the refunded amount it keeps. The
//     region that receives the request first asks the transfer's region for
//     its accounts (refundTarget), then forwards the refund to the payee's.
//
// Anyone else gets 404, as for a transfer that does not exist.

// refundTarget is what a refund needs of the transfer it refunds.
type refundTarget struct {
	From     string `json:"from"`
	To       string `json:"to"`
	Currency string `json:"currency"`
}

func transferNotFound(id string) error {
	return ledger.Errorf(ledger.CodeNotFound, "transfer %s does not exist", id)
}

// postAction serves POST /v1/transfers/{id}/capture and /void.
func (s *Handler) postAction(op string) func(context.Context, *http.Request, string) reply {
	return func(ctx context.Context, r *http.Request, client string) reply {
		c, home, err := s.actionCall(op, r, client)
		if err != nil {
			return errReply(err)
		}
		return s.do(ctx, home, c)
	}
}

// actionCall reads a capture, void or refund request: its key, its body
// and the transfer it names, with that transfer's region.
func (s *Handler) actionCall(op string, r *http.Request, client string) (call, string, error) {
	key, err := idempotencyKey(r)
	if err != nil {
		return call{}, "", err
	}
	body, err := s.readActionBody(op, r)
	if err != nil {
		return call{}, "", err
	}
	id := r.PathValue("id")
	home, err := s.home(id)
	if err != nil {
		return call{}, "", transferNotFound(id)
	}
	return call{Op: op, Client: client, ID: id, Key: key, Body: body}, home, nil
}

// readActionBody reads and checks the body of a capture, void or refund;
// an empty one (or only white space) is nil.
func (s *Handler) readActionBody(op string, r *http.Request) ([]byte, error) {
	body, err := s.readBody(r)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil
	}
	if _, err := DecodeActionRequest(op, body); err != nil {
		return nil, err
	}
	return body, nil
}

// actOnHold runs a capture or void in the hold's region.
func (s *Handler) actOnHold(ctx context.Context, c call) reply {
	req, err := DecodeActionRequest(c.Op, c.Body)
	if err != nil {
		return errReply(err)
	}
	if err := validKey(c.Key); err != nil {
		return errReply(err)
	}
	t, err := s.cfg.Ledger.Transfer(ctx, c.ID)
	if err == nil && t.ClientID != c.Client {
		err = transferNotFound(c.ID)
	}
	if err != nil {
		return errReply(err)
	}
	now := s.cfg.Now()
	cmd := ledger.Command{Type: c.Op, TransferID: t.ID, ClientID: c.Client, IdempotencyKey: c.Key,
		From: t.From, To: t.To, Amount: req.Amount, Currency: t.Currency, CreatedAt: now}
	return s.submitAction(ctx, c, cmd, t.ID, now)
}

// postRefund serves POST /v1/transfers/{id}/refunds: it learns the
// transfer's accounts from its region, then runs the refund in the payee's.
func (s *Handler) postRefund(ctx context.Context, r *http.Request, client string) reply {
	c, home, err := s.actionCall("create_refund", r, client)
	if err != nil {
		return errReply(err)
	}
	id := c.ID
	rep := s.do(ctx, home, call{Op: "refund_target", Client: client, ID: id})
	if rep.Status != http.StatusOK {
		return rep
	}
	var target refundTarget
	if err := json.Unmarshal(rep.Body, &target); err != nil {
		return errReply(err)
	}
	payee, err := s.home(target.To)
	if err != nil {
		return errReply(transferNotFound(id))
	}
	c.Target = &target
	return s.do(ctx, payee, c)
}

// readRefundTarget answers, in the transfer's region, with its accounts: to
// the API process that forwards the refund, never to a client.
func (s *Handler) readRefundTarget(ctx context.Context, c call) reply {
	t, err := s.cfg.Ledger.Transfer(ctx, c.ID)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, refundTarget{From: t.From, To: t.To, Currency: t.Currency})
}

// createRefund runs a refund in the payee's region, for the owner of the
// payee's account.
func (s *Handler) createRefund(ctx context.Context, c call) reply {
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
	if _, err := s.ownAccount(ctx, c.Client, c.Target.To); ledger.ErrorCode(err) == ledger.CodeAccountNotFound {
		return errReply(transferNotFound(c.ID)) // not the payee's owner: as if there were no such transfer
	} else if err != nil {
		return errReply(err)
	}
	id, err := s.cfg.IDs.NextString()
	if err != nil {
		return errReply(err)
	}
	now := s.cfg.Now()
	cmd := ledger.Command{Type: ledger.TypeRefund, TransferID: id, ClientID: c.Client, IdempotencyKey: c.Key,
		From: c.Target.To, To: c.Target.From, Amount: req.Amount, Currency: c.Target.Currency, CreatedAt: now, RefundOf: c.ID}
	return s.submitAction(ctx, c, cmd, id, now)
}

// submitAction validates cmd and runs it on the unclaimed path, its key's
// row naming the transfer id.
func (s *Handler) submitAction(ctx context.Context, c call, cmd ledger.Command, id string, now time.Time) reply {
	if err := cmd.Validate(s.cfg.Region, s.cfg.Regions, now); err != nil {
		return errReply(err)
	}
	claim := KeyClaim{Client: c.Client, Key: c.Key, Fingerprint: RequestFingerprint(cmd), TransferID: id, Now: now,
		Lease: s.cfg.Wait + 5*time.Second, TTL: s.cfg.KeyTTL}
	return s.submitUnclaimed(ctx, c, cmd, claim)
}
