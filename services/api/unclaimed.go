package api

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// The default path of a new transfer request: once the source account is
// known as a customer account of the client and a destination in this
// region as existing, the request is submitted without claiming its key
// first. The ledger's apply transaction is then the only
// commit: it stores the key's row with the first answer, in the same
// transaction as the debit (ledger.Command.KeyExpiresAt, postgres.Answers).
//
// What the claimed row did, and how each is kept:
//   - a repeat while the first is in this process: the process's own
//     in-flight table answers 409, or 422 for another body, without a
//     round trip (inFlight);
//   - a repeat of a key this process answered lately (answeredLately): the
//     key's row is read and replayed (or 422), without a submit;
//   - a repeat while the first is elsewhere (another API process, or a
//     first attempt whose answer was lost): the ledger stream's Nats-Msg-Id
//     window (xfer/<client>/<key>) recognises the submit, and the key's
//     row, if it is there yet, is replayed or answered 422; if not, 409;
//   - a repeat after the window: the ledger's business key folds it, and
//     the key's stored answer is replayed (or 422);
//   - the API's own answer when its wait runs out (202) makes the row
//     (Store.AnswerUnclaimed), so a repeat gets exactly that.
//
// Accounts this process has not seen it reads first (Store.CheckAccounts,
// no claim, no write), and remembers. Only Config.ClaimKeys takes the
// claimed path (claimed.go) for transfers; captures, voids and refunds
// always take this one (holds.go).

// unclaimedPath runs client requests without claiming their key first
// (see above).
type unclaimedPath struct {
	cfg      *Config
	stats    *Stats
	answers  *answerer
	seen     *accountCache
	direct   *directGroup // nil unless Config.Apply
	inflight inFlight     // the requests submitted here and not answered yet
}

// transfer checks a transfer request's accounts, then submits it.
func (p *unclaimedPath) transfer(ctx context.Context, x newTransfer) reply {
	if err := p.resolveAccounts(ctx, x); err != nil {
		return errReply(err)
	}
	return p.submit(ctx, x.command(x.claim.TransferID, x.claim.Now), x.claim)
}

// resolveAccounts vouches for the request's accounts from the accounts this
// process has seen, or reads them (one round trip shared with concurrent
// requests, no commit).
func (p *unclaimedPath) resolveAccounts(ctx context.Context, x newTransfer) error {
	if p.seen.vouches(x.claim.Client, x.req.From, x.claim.Destination) {
		return nil
	}
	st, err := p.cfg.Store.CheckAccounts(ctx, x.claim, x.req.From)
	if err != nil {
		return err
	}
	return p.seen.learn(st, x)
}

// submit runs a client request (a transfer, a capture, a void or a refund)
// on the unclaimed path: applied here or submitted to the ledger stream,
// its key's row written with its first answer by the transaction that
// applies it.
func (p *unclaimedPath) submit(ctx context.Context, cmd ledger.Command, claim KeyClaim) reply {
	p.stats.keyed(cmd.Topic())
	ck := clientKey{claim.Client, claim.Key}
	if fp, ok := p.inflight.start(ck, claim.Fingerprint); !ok {
		if !bytes.Equal(fp, claim.Fingerprint) {
			return p.answers.mismatch()
		}
		return p.answers.inFlightReply()
	}
	release := func() { p.inflight.end(ck) }
	defer func() { release() }()
	if p.answers.lately.has(ck) {
		if rep, ok := p.answers.lookup(ctx, claim, cmd.Topic()); ok {
			return rep
		}
	}
	p.stats.Unclaimed.Add(1)
	cmd.KeyExpiresAt = claim.Now.Add(claim.TTL)
	deadline := time.Now().Add(p.cfg.Wait)
	a, pending := p.applyHere(ctx, cmd, deadline)
	if a != nil {
		return p.appliedHere(ctx, cmd, claim, a, deadline)
	}
	if pending != nil {
		release = p.endWhenApplied(ck, pending)
		if p.cfg.ApplyPID != nil {
			claim.ApplyPID = p.cfg.ApplyPID()
		}
	}
	return p.toStream(ctx, cmd, claim, deadline)
}

// appliedHere answers a request with the answer its transaction here
// stored with its key. A 202 (debited, the credit still to come in another
// region) waits for the final state as for the ledger's notification of a
// 202.
func (p *unclaimedPath) appliedHere(ctx context.Context, cmd ledger.Command, claim KeyClaim, a *ledger.Answer, deadline time.Time) reply {
	p.answers.lately.add(clientKey{claim.Client, claim.Key})
	if a.Status != http.StatusAccepted {
		return stored(IdempotencyKey{Status: a.Status, Body: a.Body}, false)
	}
	told := make(chan IdempotencyKey, 1)
	told <- IdempotencyKey{ClientID: claim.Client, Key: claim.Key, TransferID: cmd.TransferID, Status: a.Status, Body: a.Body}
	return p.answers.await(ctx, waiting{cmd: cmd, claim: claim, path: p, answered: told, stop: func() {}, deadline: deadline})
}

// endWhenApplied keeps the key in flight in this process until the
// command, which may still apply here, has (pending), and the request has
// been answered (the call of the release it returns): so the key lock that
// the group's connection holds for it now can only be this request's (a
// retry here is answered 409 meanwhile).
func (p *unclaimedPath) endWhenApplied(ck clientKey, pending <-chan applied) (release func()) {
	replied := make(chan struct{})
	go func() {
		<-pending
		<-replied
		p.inflight.end(ck)
	}()
	return func() { close(replied) }
}

// toStream submits the request to the ledger stream, and awaits its
// answer. The stream's Nats-Msg-Id window recognises a key submitted
// before (submittedBefore).
func (p *unclaimedPath) toStream(ctx context.Context, cmd ledger.Command, claim KeyClaim, deadline time.Time) reply {
	// Wait before submitting, so that the ledger's notification cannot
	// come before the wait.
	answered, stop := p.answers.keys.done(claim.Client, claim.Key)
	dup, err := p.cfg.Router.Submit(ctx, cmd)
	if err != nil {
		stop()
		return errReply(err) // nothing is claimed: a retry submits again, and is recognised if this one was stored
	}
	if dup {
		stop()
		return p.submittedBefore(ctx, claim, cmd)
	}
	return p.answers.answer(ctx, waiting{cmd: cmd, claim: claim, path: p, answered: answered, stop: stop, deadline: deadline})
}

// keep stores the API's own answer with the key, making its row
// (Store.AnswerUnclaimed).
func (p *unclaimedPath) keep(ctx context.Context, claim KeyClaim, status int, body []byte) (IdempotencyKey, error) {
	return p.cfg.Store.AnswerUnclaimed(ctx, claim, status, body)
}

// inFlight is this process's table of the unclaimed requests it has
// submitted and not answered yet, by client and key, with their
// fingerprints.
type inFlight struct {
	mu sync.Mutex
	m  map[clientKey][]byte
}

// start enters a request; when the key is already in flight here it
// returns that request's fingerprint and false.
func (f *inFlight) start(k clientKey, fingerprint []byte) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fp, ok := f.m[k]; ok {
		return fp, false
	}
	if f.m == nil {
		f.m = map[clientKey][]byte{}
	}
	f.m[k] = fingerprint
	return nil, true
}

func (f *inFlight) end(k clientKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, k)
}

// applyHere runs cmd in this process's next group transaction (direct.go)
// and returns the answer that transaction stored with its key. It returns
// nil, for the caller to submit cmd to the ledger stream under the same
// Msg-Id, when there is no group (Config.Apply unset), when its queue is
// full, when the transaction failed, when cmd neither applied nor was
// refused there (a duplicate, a conflict, a request to dead-letter), or
// when deadline passed first (the transaction may still roll back, so only
// the stream makes a 202 true); pending then delivers the command's
// outcome here once the group has it (within the group transaction's own
// timeout).
func (p *unclaimedPath) applyHere(ctx context.Context, cmd ledger.Command, deadline time.Time) (a *ledger.Answer, pending <-chan applied) {
	if p.direct == nil {
		return nil, nil
	}
	out, ok := p.direct.submit(ctx, cmd)
	if !ok {
		p.stats.Handed.Add(1)
		return nil, nil
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case r := <-out:
		// Only this request's own effect is answered here; a repeat, a
		// key reused for another body or a request to dead-letter is
		// answered as the stream path answers it.
		if own := r.res.Kind == ledger.Applied || r.res.Kind == ledger.Rejected; r.err == nil && own && r.res.Answer != nil {
			p.stats.Direct.Add(1)
			return r.res.Answer, nil
		}
		if r.err != nil && ctx.Err() == nil { // not a request left out for its ended context
			p.cfg.Log.Warn("applying here failed; submitting to the ledger stream", "transfer", cmd.TransferID, "err", r.err)
		}
		p.stats.Handed.Add(1)
		return nil, nil
	case <-wait.C:
	case <-ctx.Done():
	}
	p.stats.Handed.Add(1)
	return nil, out
}

// submittedBefore answers an unclaimed request whose submit the ledger
// stream recognised: the same key was submitted within its window. The
// key's row, once there, is replayed (or 422 for another body). Without a
// row, what the key made (its row expired meanwhile: the business key
// outlives it) is the answer, as on the claimed path; without either, the
// first submission is still being applied: 409.
func (p *unclaimedPath) submittedBefore(ctx context.Context, claim KeyClaim, cmd ledger.Command) reply {
	if rep, ok := p.answers.lookup(ctx, claim, cmd.Topic()); ok {
		return rep
	}
	st, b, found, err := p.firstAnswer(ctx, claim, cmd)
	if err != nil {
		return errReply(err)
	}
	if !found {
		return p.answers.inFlightReply()
	}
	k, err := p.keep(ctx, claim, st, b)
	if err != nil {
		return errReply(err)
	}
	if k.InFlight { // a transaction of another API process is deciding the key
		return p.answers.inFlightReply()
	}
	return stored(k, k.TransferID != claim.TransferID)
}

// firstAnswer is the answer to a repeat of cmd from the ledger's record of
// what its key made, as the ledger answers a repeat: for a capture or
// void, its action with the hold as it is now; for an account action, its
// record with the account as it is now; for a transfer or refund, the
// transfer. False when the ledger has no record yet.
func (p *unclaimedPath) firstAnswer(ctx context.Context, claim KeyClaim, cmd ledger.Command) (int, []byte, bool, error) {
	if cmd.IsKeyedAction() {
		a, found, err := p.cfg.Ledger.ActionByKey(ctx, claim.Client, claim.Key)
		if err != nil || !found {
			return 0, nil, false, err
		}
		first := ledger.Result{Kind: ledger.Duplicate, Action: &a}
		if cmd.IsAccountAction() {
			acct, err := p.cfg.Ledger.Account(ctx, cmd.From)
			if err != nil {
				return 0, nil, false, err
			}
			first.Account = &acct
		} else if first.Transfer, err = p.cfg.Ledger.Transfer(ctx, a.TransferID); err != nil {
			return 0, nil, false, err
		}
		st, b := repeatAnswer(cmd, a.Fingerprint, first)
		return st, b, true, nil
	}
	prior, found, err := p.cfg.Store.TransferByKey(ctx, claim.Client, claim.Key)
	if err != nil || !found {
		return 0, nil, false, err
	}
	st, b := repeatAnswer(cmd, prior.Fingerprint, ledger.Result{Kind: ledger.Duplicate, Transfer: prior})
	return st, b, true, nil
}
