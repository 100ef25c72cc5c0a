package api

import (
	"context"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// The claimed path of a transfer request (Config.ClaimKeys): the request
// claims its idempotency key in a commit of its own before it is
// submitted, in the round trip that reads its accounts (Store.StartKey).
// A repeat then finds the key's row, whichever API process of the region
// has the first: it is replayed, 422 for another body, 409 while the first
// is in flight; a claim whose holder died is taken over once its lease
// ends (KeyTakenOver), and the request submitted again under the same
// Nats-Msg-Id. The ledger stores the first answer with the key in the
// transaction that applies the transfer.
type claimedPath struct {
	cfg     *Config
	answers *answerer
	seen    *accountCache
}

// transfer claims the request's key with the read of its accounts, answers
// a key that exists from it, answers a request whose business key already
// made a transfer with that transfer, and submits the rest.
func (p *claimedPath) transfer(ctx context.Context, x newTransfer) reply {
	p.answers.stats.keyed(ledger.TopicTransfer)
	st, err := p.claim(ctx, x)
	if err != nil {
		return errReply(err)
	}
	if !st.Claimed { // the key exists, or the claim's outcome is unknown
		if rep, done := p.resolve(ctx, x, &st); done {
			return rep
		}
	}
	cmd := x.command(st.Key.TransferID, st.Key.CreatedAt)
	if st.Prior.ID != "" {
		// The ledger's business key outlives the idempotency key: a
		// request repeated after its key expired is answered with the
		// transfer it made.
		return p.answerPrior(ctx, cmd, st.Prior)
	}
	return p.submit(ctx, cmd, x.claim)
}

// claim reads the request's accounts and claims its key if it is new, in
// one round trip (StartKey), which teaches this process the accounts. When
// the claim's outcome is unknown, the accounts are checked on their own
// and the zero KeyStart leaves the key to resolve (ResolveKey finds an own
// claim).
func (p *claimedPath) claim(ctx context.Context, x newTransfer) (KeyStart, error) {
	st, err := p.cfg.Store.StartKey(ctx, x.claim, x.req.From)
	if err == nil {
		return st, p.seen.learn(st, x)
	}
	if _, err := ownAccount(ctx, p.cfg.Ledger, x.claim.Client, x.req.From); err != nil {
		return KeyStart{}, err
	}
	if x.claim.Destination != "" {
		if _, err := p.cfg.Ledger.Account(ctx, x.claim.Destination); err != nil {
			return KeyStart{}, err
		}
	}
	return KeyStart{}, nil
}

// resolve takes a key that was not claimed as new (ResolveKey): a repeat
// is answered from it; otherwise st gets the key the request now holds and
// the transfer its business key made, if any.
func (p *claimedPath) resolve(ctx context.Context, x newTransfer, st *KeyStart) (reply, bool) {
	k, outcome, err := p.cfg.Store.ResolveKey(ctx, x.claim)
	if err != nil {
		return errReply(err), true
	}
	if rep, ok := p.answers.fromKey(ctx, k, outcome, ledger.TopicTransfer); ok {
		return rep, true
	}
	prior, _, err := p.cfg.Store.TransferByKey(ctx, x.claim.Client, x.claim.Key)
	if err != nil {
		return errReply(err), true
	}
	st.Key, st.Prior = k, prior
	return reply{}, false
}

// answerPrior answers cmd with the transfer its key made before, and
// stores that answer with the key.
func (p *claimedPath) answerPrior(ctx context.Context, cmd ledger.Command, t ledger.Transfer) reply {
	st, b := repeatAnswer(cmd, t.Fingerprint, ledger.Result{Kind: ledger.Duplicate, Transfer: t})
	k, err := p.cfg.Store.Answer(ctx, cmd.ClientID, cmd.IdempotencyKey, st, b, false)
	if err != nil {
		return errReply(err)
	}
	return stored(k, false)
}

// submit hands cmd to the ledger stream and awaits its answer.
func (p *claimedPath) submit(ctx context.Context, cmd ledger.Command, claim KeyClaim) reply {
	// Wait before submitting, so that the ledger's notification cannot
	// come before the wait.
	answered, stop := p.answers.keys.done(claim.Client, claim.Key)
	if _, err := p.cfg.Router.Submit(ctx, cmd); err != nil {
		stop()
		return errReply(err) // the key stays in flight; a retry after its lease takes it over
	}
	return p.answers.answer(ctx, waiting{cmd: cmd, claim: claim, path: p, answered: answered, stop: stop,
		deadline: time.Now().Add(p.cfg.Wait)})
}

// keep stores the API's own answer with the key the request claimed.
func (p *claimedPath) keep(ctx context.Context, claim KeyClaim, status int, body []byte) (IdempotencyKey, error) {
	return p.cfg.Store.Answer(ctx, claim.Client, claim.Key, status, body, false)
}
