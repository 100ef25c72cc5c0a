package api

import (
	"bytes"
	"context"
	"net/http"

	"github.com/paymesh/paymesh/services/ledger"
)

// Closing, freezing and unfreezing an account. Each is a client request
// with a required Idempotency-Key, run on the unclaimed path in the
// account's home region, for the client that owns it (anyone else gets
// 404, as for an account that does not exist): a command through the
// ledger stream, whose ledger decides it against the account's locked row
// and records it (account_actions), so that a retry from any region gets
// the first answer, and another request under the key gets 422.
//   - close: the account takes no debit or credit after (a credit from
//     another region is refused and refunded to its sender); it needs a
//     zero balance, no open hold and no transfer on its way out, else 409
//     account_not_empty;
//   - freeze: the account's debits are refused (account_frozen); credits
//     still land;
//   - unfreeze: its debits go through again.
//
// The answer is 200 with the account as the change left it.
type accountActions struct {
	cfg                     *Config
	fwd                     *forwarder
	unclaimed               *unclaimedPath
	close, freeze, unfreeze operation
}

func newAccountActions(cfg *Config, fwd *forwarder, unclaimed *unclaimedPath) *accountActions {
	a := &accountActions{cfg: cfg, fwd: fwd, unclaimed: unclaimed}
	takes := shape{id: idHere, key: requiredKey, body: optionalBody}
	a.close = operation{name: "close_account", run: a.runHere(ledger.TypeClose), takes: takes}
	a.freeze = operation{name: "freeze_account", run: a.runHere(ledger.TypeFreeze), takes: takes}
	a.unfreeze = operation{name: "unfreeze_account", run: a.runHere(ledger.TypeUnfreeze), takes: takes}
	return a
}

// post serves POST /v1/accounts/{id}/close, /freeze and /unfreeze: op runs
// in the account's home region.
func (a *accountActions) post(op operation) func(context.Context, *http.Request, string) reply {
	return func(ctx context.Context, r *http.Request, client string) reply {
		key, err := idempotencyKey(r)
		if err != nil {
			return errReply(err)
		}
		body, err := readBody(r)
		if err == nil {
			err = checkAccountActionBody(body)
		}
		if err != nil {
			return errReply(err)
		}
		id := r.PathValue("id")
		home, err := a.fwd.home(id)
		if err != nil {
			return errReply(notFound(id))
		}
		return a.fwd.do(ctx, home, op, Call{Client: client, ID: id, Key: key})
	}
}

// checkAccountActionBody accepts no body, or an empty JSON object: an
// account action has no fields.
func checkAccountActionBody(body []byte) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	return decodeStrict(body, &struct{}{})
}

// runHere returns the run of an account action (typ) in the account's
// home region.
func (a *accountActions) runHere(typ string) func(context.Context, Call) reply {
	return func(ctx context.Context, c Call) reply {
		if err := checkAccountActionBody(c.Body); err != nil {
			return errReply(err)
		}
		if err := validKey(c.Key); err != nil {
			return errReply(err)
		}
		if _, err := ownAccount(ctx, a.cfg.Ledger, c.Client, c.ID); err != nil {
			return errReply(err)
		}
		now := a.cfg.Now()
		cmd := ledger.Command{Type: typ, ClientID: c.Client, IdempotencyKey: c.Key, From: c.ID, CreatedAt: now}
		if err := cmd.Validate(a.cfg.Region, a.cfg.Regions, now); err != nil {
			return errReply(err)
		}
		return a.unclaimed.submit(ctx, cmd, a.cfg.claim(c.Client, c.Key, RequestFingerprint(cmd), "", now))
	}
}
