package api

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// POST /v1/transfers, stage by stage, top-down through the files named.
// Each stage refuses what it can tell, and each duplicate is caught at the
// first layer that can tell it (ledger.Layers; the ledger's own are in
// services/ledger/postgres/apply.go):
//
//  1. admit (auth.go, auth.keyed): the API key, its role and its rate
//     limit.
//  2. read (transfers.post, readRequest): the Idempotency-Key header, the
//     body (decoded once, and kept with the call), and the home regions of
//     both accounts.
//  3. forward (forward.go, forwarder.do): the call runs in the home region
//     of the source account, here or over NATS. The key lives there, so a
//     repeat sent to any region meets its first request's key.
//  4. check (transfers.createHere, check, refuse): the key's spelling, a
//     new transfer ID, and what the ledger would refuse (Command.Validate),
//     so that an accepted key always leads to a recorded transfer. A hold
//     retried after the expiry it asked for is replayed from its key.
//  5. key path (keyPath, decided once by Config.ClaimKeys):
//     - unclaimed (unclaimed.go, unclaimedPath.transfer; the default):
//     resolve the accounts (the account cache, else Store.CheckAccounts),
//     then submit: a key in flight in this process is 409, or 422 for
//     another body (inFlight); a key answered lately is replayed from its
//     row (answeredLately); the request is applied here in a group
//     transaction (direct.go) or submitted to the ledger stream, whose
//     Nats-Msg-Id window recognises a key submitted before
//     (submittedBefore: replay, 422 or 409).
//     - claimed (claimed.go, claimedPath.transfer): resolve the accounts
//     and claim the key in one round trip (Store.StartKey); a key that
//     exists is replayed, 422 for another body, 409 while in flight
//     (Store.ResolveKey); a transfer the key made before its row expired
//     is the answer (the ledger's business key); then submit to the
//     ledger stream.
//  6. await (answer.go, answerer.await): the answer the ledger stored with
//     the key, for a cross-region transfer its final state, or when the
//     wait runs out a 202, stored with the key first so that a repeat gets
//     exactly that. An answer of another request (a repeat the ledger's
//     business key folded) is replayed, or 422.
//
// Past the API the ledger catches the rest: its consume-log (a group
// transaction here and the ledger's consumer: whichever commits first
// wins), its business key and its state compare-and-set.

// transfers serves /v1/transfers: a new transfer, and reading one.
type transfers struct {
	cfg     *Config
	fwd     *forwarder
	answers *answerer
	path    keyPath
	// The operations run in the home region of the source account (create)
	// and of the transfer (read).
	create, read operation
}

func newTransfers(cfg *Config, fwd *forwarder, answers *answerer, path keyPath) *transfers {
	t := &transfers{cfg: cfg, fwd: fwd, answers: answers, path: path}
	t.create = operation{name: "create_transfer", run: t.createHere, takes: shape{key: requiredKey, body: requiredBody}}
	t.read = operation{name: "get_transfer", run: t.readHere, takes: shape{id: idHere}}
	return t
}

// post serves POST /v1/transfers: it reads the request (stage 2) and runs
// it in the home region of its source account (stage 3).
func (t *transfers) post(ctx context.Context, r *http.Request, client string) reply {
	c, home, err := t.readRequest(r, client)
	if err != nil {
		return errReply(err)
	}
	return t.fwd.do(ctx, home, t.create, c)
}

// readRequest reads a new transfer: its key, its body decoded, and the
// home region of its source account.
func (t *transfers) readRequest(r *http.Request, client string) (Call, string, error) {
	key, err := idempotencyKey(r)
	if err != nil {
		return Call{}, "", err
	}
	body, err := readBody(r)
	if err != nil {
		return Call{}, "", err
	}
	req, err := DecodeTransferRequest(body)
	if err != nil {
		return Call{}, "", err
	}
	home, err := t.cfg.Regions.HomeRegion(req.From)
	if err != nil {
		return Call{}, "", ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", req.From)
	}
	if _, err := t.cfg.Regions.HomeRegion(req.To); err != nil {
		return Call{}, "", ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", req.To)
	}
	return Call{Client: client, Key: key, Body: body, transfer: &req}, home, nil
}

// transferRequest is the call's transfer request: the one its receiver
// decoded, or for a forwarded call its body decoded here.
func (c Call) transferRequest() (TransferRequest, error) {
	if c.transfer != nil {
		return *c.transfer, nil
	}
	return DecodeTransferRequest(c.Body)
}

// newTransfer is a transfer request checked in its home region: what it
// asks, and its key's claim (client and key, fingerprint, the new transfer
// ID, the request's time, and the destination when it lives here).
type newTransfer struct {
	req   TransferRequest
	claim KeyClaim
}

// command is the request's ledger command, as transfer id made at created.
func (x newTransfer) command(id string, created time.Time) ledger.Command {
	return x.req.command(id, x.claim.Client, x.claim.Key, created)
}

// A keyPath takes a checked transfer request through its idempotency key
// to its answer (stage 5): unclaimedPath, or claimedPath with
// Config.ClaimKeys.
type keyPath interface {
	// transfer resolves the request's accounts, answers a repeat of its
	// key, or submits it and awaits its answer.
	transfer(ctx context.Context, x newTransfer) reply
	// keep stores the API's own answer (the 202 of a wait that ran out)
	// with the request's key, and returns the key as stored.
	keep(ctx context.Context, claim KeyClaim, status int, body []byte) (IdempotencyKey, error)
}

// createHere runs a new transfer in the home region of its source account:
// check it (stage 4), then take it through its key (stage 5).
func (t *transfers) createHere(ctx context.Context, c Call) reply {
	x, err := t.check(c)
	if err != nil {
		return errReply(err)
	}
	now := x.claim.Now
	if err := x.command(x.claim.TransferID, now).Validate(t.cfg.Region, t.cfg.Regions, now); err != nil {
		return t.refuse(ctx, x, err)
	}
	return t.path.transfer(ctx, x)
}

// check decodes the call's request, checks its key, and gives it a
// transfer ID and its key's claim.
func (t *transfers) check(c Call) (newTransfer, error) {
	req, err := c.transferRequest()
	if err != nil {
		return newTransfer{}, err
	}
	if err := validKey(c.Key); err != nil {
		return newTransfer{}, err
	}
	id, err := t.cfg.IDs.NextString()
	if err != nil {
		return newTransfer{}, err
	}
	claim := t.cfg.claim(c.Client, c.Key, req.fingerprint(), id, t.cfg.Now())
	if home, _ := t.cfg.Regions.HomeRegion(req.To); home == t.cfg.Region {
		// A destination here must exist before the key is claimed: the
		// ledger would not refuse a missing one but dead-letter it, to be
		// replayed once it exists, and the client would get a 202.
		claim.Destination = req.To
	}
	return newTransfer{req: req, claim: claim}, nil
}

// claim is a request's claim on its key, for transfer id at now.
func (cfg *Config) claim(client, key string, fingerprint []byte, id string, now time.Time) KeyClaim {
	return KeyClaim{Client: client, Key: key, Fingerprint: fingerprint, TransferID: id, Now: now,
		Lease: cfg.Wait + 5*time.Second, TTL: cfg.KeyTTL}
}

// refuse answers a request the ledger would refuse with err. Another
// client's account is refused first, as if it did not exist.
func (t *transfers) refuse(ctx context.Context, x newTransfer, err error) reply {
	if _, oerr := ownAccount(ctx, t.cfg.Ledger, x.claim.Client, x.req.From); oerr != nil {
		return errReply(oerr)
	}
	if x.req.Hold {
		// A retry of a hold after the expiry it asked for is no longer
		// valid as new, but its key holds the first answer.
		k, ok, kerr := t.cfg.Store.Key(ctx, x.claim.Client, x.claim.Key)
		if kerr == nil && ok && !k.InFlight && bytes.Equal(k.Fingerprint, x.claim.Fingerprint) {
			return t.answers.replay(ctx, k, ledger.TopicTransfer)
		}
	}
	return errReply(err)
}

// get serves GET /v1/transfers/{id}.
func (t *transfers) get(ctx context.Context, r *http.Request, client string) reply {
	id := r.PathValue("id")
	home, err := t.fwd.home(id)
	if err != nil {
		return errReply(err)
	}
	return t.fwd.do(ctx, home, t.read, Call{Client: client, ID: id})
}

// readHere reads a transfer of the client in its home region, with its
// steps and, for a payment, its refunds.
func (t *transfers) readHere(ctx context.Context, c Call) reply {
	tr, err := t.cfg.Ledger.Transfer(ctx, c.ID)
	if err == nil && tr.ClientID != c.Client {
		err = ledger.Errorf(ledger.CodeNotFound, "transfer %s does not exist", c.ID)
	}
	if err != nil {
		return errReply(err)
	}
	body := transferBody(tr)
	ps, err := t.cfg.Ledger.TransferPostings(ctx, tr.ID)
	if err != nil {
		return errReply(err)
	}
	if tr.RefundOf == "" && (tr.Status == ledger.StatusCompleted || tr.Status == ledger.StatusDebited) {
		refunds, total, err := t.cfg.Ledger.Refunds(ctx, tr.ID)
		if err != nil {
			return errReply(err)
		}
		body.RefundedAmount = &total
		for _, r := range refunds {
			body.Refunds = append(body.Refunds, RefundBody{ID: r.ID, Amount: r.Amount, Status: r.Status})
		}
	}
	for _, p := range ps {
		body.Steps = append(body.Steps, StepBody{Leg: string(p.Leg), Account: p.AccountID, Amount: p.Amount})
	}
	return jsonReply(http.StatusOK, body)
}
