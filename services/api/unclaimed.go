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
// claimed path (StartKey).

// accountCache remembers accounts this process read: who owns them. An
// account's owner and kind never change and accounts are never deleted,
// so an entry is never stale; the cache only bounds its size.
type accountCache struct {
	mu    sync.RWMutex
	owner map[string]string // account ID -> its client if a customer account, "" otherwise
}

// maxAccountCache bounds the accounts remembered; the cache starts over when
// it is full.
const maxAccountCache = 1 << 17

func (c *accountCache) remember(a ledger.Account) {
	owner := ""
	if a.Kind == ledger.KindCustomer {
		owner = a.ClientID
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.room()
	c.owner[a.ID] = owner
}

// room makes the map, or starts it over when full. c.mu is held.
func (c *accountCache) room() {
	if c.owner == nil || len(c.owner) >= maxAccountCache {
		c.owner = map[string]string{}
	}
}

// rememberExists records that account id exists (its owner unknown: it is
// not vouched for as anyone's source).
func (c *accountCache) rememberExists(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.room()
	if _, ok := c.owner[id]; !ok {
		c.owner[id] = ""
	}
}

// vouches reports whether source is known as a customer account of client
// and destination ("" for none to check) as existing.
func (c *accountCache) vouches(client, source, destination string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if owner, ok := c.owner[source]; !ok || owner == "" || owner != client {
		return false
	}
	if destination == "" {
		return true
	}
	_, ok := c.owner[destination]
	return ok
}

// answeredLately remembers the keys this process answered (on either
// path) in the last span to two spans, so that a client's retry is answered
// from the key's row without a submit (which the ledger stream would
// recognise as well: one retry, counted by two layers). Two sets, the
// older dropped every span, bound it by time.
type answeredLately struct {
	mu        sync.Mutex
	cur, prev map[clientKey]struct{}
	since     time.Time
	span      time.Duration
}

// answeredLatelySpan is answeredLately's span: retries come within seconds.
const answeredLatelySpan = 30 * time.Second

func (a *answeredLately) rotate(now time.Time) {
	if a.cur == nil || now.Sub(a.since) > a.span {
		a.prev, a.cur, a.since = a.cur, map[clientKey]struct{}{}, now
	}
}

func (a *answeredLately) add(k clientKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rotate(time.Now())
	a.cur[k] = struct{}{}
}

func (a *answeredLately) has(k clientKey) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rotate(time.Now())
	_, cur := a.cur[k]
	_, prev := a.prev[k]
	return cur || prev
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

// createUnclaimed submits a transfer request without claiming its key
// (see above), and answers it as createTransfer would.
func (s *Handler) createUnclaimed(ctx context.Context, c call, req TransferRequest, claim KeyClaim) reply {
	return s.submitUnclaimed(ctx, c, req.command(claim.TransferID, c.Client, c.Key, claim.Now), claim)
}

// submitUnclaimed runs a client request (a transfer, a capture, a void or a
// refund) on the unclaimed path: applied here or submitted, its key's row
// written with its first answer by the transaction that applies it.
func (s *Handler) submitUnclaimed(ctx context.Context, c call, cmd ledger.Command, claim KeyClaim) reply {
	ck := clientKey{c.Client, c.Key}
	if fp, ok := s.inflight.start(ck, claim.Fingerprint); !ok {
		if !bytes.Equal(fp, claim.Fingerprint) {
			return s.mismatch()
		}
		return s.inFlightReply()
	}
	release := func() { s.inflight.end(ck) }
	defer func() { release() }()
	if s.lately.has(ck) {
		k, outcome, err := s.cfg.Store.LookupKey(ctx, claim)
		if err != nil {
			return errReply(err)
		}
		if rep, ok := s.fromKey(ctx, k, outcome); ok {
			return rep
		}
	}
	s.Stats.Unclaimed.Add(1)
	cmd.KeyExpiresAt = claim.Now.Add(claim.TTL)
	deadline := time.Now().Add(s.cfg.Wait)
	a, pending := s.applyHere(ctx, cmd, deadline)
	if a != nil {
		s.lately.add(ck)
		if a.Status != http.StatusAccepted {
			return stored(IdempotencyKey{Status: a.Status, Body: a.Body}, false)
		}
		// Debited, the credit still to come (another region): wait for the
		// final state as for the ledger's notification of a 202.
		told := make(chan IdempotencyKey, 1)
		told <- IdempotencyKey{ClientID: c.Client, Key: c.Key, TransferID: cmd.TransferID, Status: a.Status, Body: a.Body}
		return s.await(ctx, cmd, claim, told, func() {}, true, deadline)
	}
	if pending != nil {
		// The command may still apply here. The key stays in flight in this
		// process until it has, and the request has been answered: so the
		// key lock that the group's connection holds for it now can only be
		// this request's (a retry here is answered 409 meanwhile).
		replied := make(chan struct{})
		release = func() { close(replied) }
		go func() {
			<-pending
			<-replied
			s.inflight.end(ck)
		}()
		if s.cfg.ApplyPID != nil {
			claim.ApplyPID = s.cfg.ApplyPID()
		}
	}
	answered, stop := s.keys.done(c.Client, c.Key)
	dup, err := s.cfg.Router.Submit(ctx, cmd)
	if err != nil {
		stop()
		return errReply(err) // nothing is claimed: a retry submits again, and is recognised if this one was stored
	}
	if dup {
		stop()
		return s.submittedBefore(ctx, claim, cmd)
	}
	rep := s.await(ctx, cmd, claim, answered, stop, true, deadline)
	s.lately.add(ck)
	return rep
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
func (s *Handler) applyHere(ctx context.Context, cmd ledger.Command, deadline time.Time) (a *ledger.Answer, pending <-chan applied) {
	if s.direct == nil {
		return nil, nil
	}
	out, ok := s.direct.submit(ctx, cmd)
	if !ok {
		s.Stats.Handed.Add(1)
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
			s.Stats.Direct.Add(1)
			return r.res.Answer, nil
		}
		if r.err != nil {
			s.cfg.Log.Warn("applying here failed; submitting to the ledger stream", "transfer", cmd.TransferID, "err", r.err)
		}
		s.Stats.Handed.Add(1)
		return nil, nil
	case <-wait.C:
	case <-ctx.Done():
	}
	s.Stats.Handed.Add(1)
	return nil, out
}

// submittedBefore answers an unclaimed request whose submit the ledger
// stream recognised: the same key was submitted within its window. The
// key's row, once there, is replayed (or 422 for another body). Without a
// row, a transfer the key made (its row expired meanwhile: the business key
// outlives it) is the answer, as on the claimed path; without either, the
// first submission is still being applied: 409.
func (s *Handler) submittedBefore(ctx context.Context, claim KeyClaim, cmd ledger.Command) reply {
	k, outcome, err := s.cfg.Store.LookupKey(ctx, claim)
	if err != nil {
		return errReply(err)
	}
	if rep, ok := s.fromKey(ctx, k, outcome); ok {
		return rep
	}
	var st int
	var b []byte
	if cmd.IsAction() {
		// A capture's or void's record, with the hold as it is now: as the
		// ledger answers a repeat of it.
		a, found, err := s.cfg.Ledger.ActionByKey(ctx, claim.Client, claim.Key)
		if err != nil {
			return errReply(err)
		}
		if !found {
			return s.inFlightReply()
		}
		hold, err := s.cfg.Ledger.Transfer(ctx, a.TransferID)
		if err != nil {
			return errReply(err)
		}
		st, b = RespondTo(cmd, ledger.Result{Kind: ledger.Duplicate, Action: &a, Transfer: hold})
		if !bytes.Equal(a.Fingerprint, cmd.Fingerprint()) {
			st, b = problem(ledger.Errorf(ledger.CodeIdempotencyKeyReused, "the Idempotency-Key was used for a different request"))
		}
	} else {
		prior, found, err := s.cfg.Store.TransferByKey(ctx, claim.Client, claim.Key)
		if err != nil {
			return errReply(err)
		}
		if !found {
			return s.inFlightReply()
		}
		st, b = Respond(ledger.Result{Kind: ledger.Duplicate, Transfer: prior})
		if !bytes.Equal(prior.Fingerprint, cmd.Fingerprint()) {
			st, b = problem(ledger.Errorf(ledger.CodeIdempotencyKeyReused, "the Idempotency-Key was used for a different request"))
		}
	}
	if k, err = s.cfg.Store.AnswerUnclaimed(ctx, claim, st, b); err != nil {
		return errReply(err)
	}
	if k.InFlight { // a transaction of another API process is deciding the key
		return s.inFlightReply()
	}
	return stored(k, k.TransferID != claim.TransferID)
}

// fromKey answers a request from its key as found (LookupKey, ResolveKey):
// 422 for another request's fingerprint, the stored answer replayed, or 409
// while in flight; false for a key the request may go on with.
func (s *Handler) fromKey(ctx context.Context, k IdempotencyKey, outcome KeyOutcome) (reply, bool) {
	switch outcome {
	case KeyMismatch:
		return s.mismatch(), true
	case KeyReplay:
		return s.replay(ctx, k), true
	case KeyInFlight:
		return s.inFlightReply(), true
	}
	return reply{}, false
}

// mismatch is the answer to a key reused with another body.
func (s *Handler) mismatch() reply {
	s.Stats.Mismatches.Add(1)
	return errReply(ledger.Errorf(ledger.CodeIdempotencyKeyReused, "the Idempotency-Key was used for a different request"))
}

// inFlightReply is the answer to a repeat while the first is in flight.
func (s *Handler) inFlightReply() reply {
	s.Stats.InFlight.Add(1)
	rep := errReply(ledger.Errorf(CodeIdempotencyKeyInFlight, "a request with this Idempotency-Key is being processed"))
	rep.Header["Retry-After"] = "1"
	return rep
}

// replay answers a repeat with the key's stored answer. A provisional one
// (the ledger's 202) has now been seen by a client: it is frozen, so that
// everyone keeps getting it.
func (s *Handler) replay(ctx context.Context, k IdempotencyKey) reply {
	s.Stats.Replays.Add(1)
	if !k.Final {
		var err error
		if k, err = s.cfg.Store.Answer(ctx, k.ClientID, k.Key, k.Status, k.Body, false); err != nil {
			return errReply(err)
		}
	}
	return stored(k, true)
}
