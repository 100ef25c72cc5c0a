package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// HeaderReplayed marks a response replayed from an idempotency key.
const HeaderReplayed = "Idempotent-Replayed"

// answerer answers client requests through their idempotency keys: it
// awaits the answer the ledger stores with a submitted request's key, and
// answers a repeat from its key (replayed, 422 for another body, 409 while
// the first is in flight). Whatever it answers is stored with the key
// first, so that every repeat gets exactly that.
type answerer struct {
	cfg    *Config
	stats  *Stats
	keys   keyWaiter // the keys of the requests waiting for the ledger's answer
	lately answeredLately
}

// waiting is a submitted request waiting for its answer.
type waiting struct {
	cmd   ledger.Command
	claim KeyClaim
	// path keeps the API's own answer with the key (keyPath.keep).
	path keyPath
	// answered and stop are the key's wait (keyWaiter.done).
	answered <-chan IdempotencyKey
	stop     func()
	deadline time.Time
}

// answer awaits w's answer, and remembers its key as answered lately: a
// retry on the unclaimed path reads the key, not submits.
func (a *answerer) answer(ctx context.Context, w waiting) reply {
	rep := a.await(ctx, w)
	a.lately.add(clientKey{w.cmd.ClientID, w.cmd.IdempotencyKey})
	return rep
}

// await waits for the ledger's stored response, and for a cross-region
// transfer (stored 202) for its final state, up to w.deadline. Until the
// ledger answered it waits with every other request (told by the ledger,
// or one query for all of them: keyWaiter); then it reads the key's
// answer, and for a provisional 202 polls the transfer's state.
func (a *answerer) await(ctx context.Context, w waiting) reply {
	k, ok := a.told(ctx, w)
	read := !ok // the key must be read (again)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if read {
			var err error
			if k, ok, err = a.cfg.Store.Key(ctx, w.cmd.ClientID, w.cmd.IdempotencyKey); err != nil {
				return errReply(err)
			}
		}
		read = true
		if rep, done := a.settle(ctx, w, k, ok); done {
			return rep
		}
		select {
		case <-ctx.Done():
			return errReply(ctx.Err())
		case <-tick.C:
		}
	}
}

// told waits, up to the deadline, for the key's answer from its wait,
// which it then stops; false when none came.
func (a *answerer) told(ctx context.Context, w waiting) (IdempotencyKey, bool) {
	defer w.stop()
	t := time.NewTimer(time.Until(w.deadline))
	defer t.Stop()
	select {
	case k := <-w.answered:
		return k, true
	case <-t.C:
	case <-ctx.Done():
	}
	return IdempotencyKey{}, false
}

// settle answers w from its key as read (ok: there is a row) when it can;
// false to read the key again at the next tick.
func (a *answerer) settle(ctx context.Context, w waiting, k IdempotencyKey, ok bool) (reply, bool) {
	if ok && !k.InFlight && k.TransferID != "" && k.TransferID != w.cmd.TransferID {
		// Another request's answer: this one's key was answered before (a
		// repeat folded by the ledger's business key). The stored row says
		// whether it is this request's.
		k2, outcome, err := a.cfg.Store.LookupKey(ctx, w.claim)
		switch {
		case err != nil:
			return errReply(err), true
		case outcome == KeyMismatch:
			return a.mismatch(), true
		case outcome == KeyReplay:
			return a.replay(ctx, k2, w.cmd.Topic()), true
		}
		k, ok = k2, outcome != KeyNew // in flight again (taken over): wait on
	}
	if ok && !k.InFlight {
		if rep, done := a.final(ctx, w, k); done {
			return rep, true
		}
	}
	if time.Now().After(w.deadline) {
		return a.expired(ctx, w, k, ok), true
	}
	return reply{}, false
}

// final answers from a key the ledger answered: with its answer, now
// final, or for a provisional 202 with the transfer's state once it is
// past debited. False while the transfer is still moving.
func (a *answerer) final(ctx context.Context, w waiting, k IdempotencyKey) (reply, bool) {
	client, key := w.cmd.ClientID, w.cmd.IdempotencyKey
	if k.Final || k.Status != http.StatusAccepted {
		return a.frozen(ctx, client, key, k, false), true
	}
	t, err := a.cfg.Ledger.Transfer(ctx, w.cmd.TransferID)
	if err != nil || t.ClientID != client || t.Status == ledger.StatusDebited {
		return reply{}, false
	}
	st, b := RespondTo(w.cmd, ledger.Result{Kind: ledger.Applied, Transfer: t})
	if k, err = a.cfg.Store.Answer(ctx, client, key, st, b, true); err != nil {
		return errReply(err), true
	}
	return stored(k, false), true
}

// expired answers when the wait ran out, from the key as last read (ok:
// there is a row).
func (a *answerer) expired(ctx context.Context, w waiting, k IdempotencyKey, ok bool) reply {
	if !w.cmd.IsKeyedAction() {
		return a.accepted(ctx, w)
	}
	// A capture, void or account action is not answered before its ledger
	// decided it: the hold's or account's state says nothing of which
	// request won. The key holds no
	// answer yet, so a retry gets the decision.
	if ok && !k.InFlight { // decided: the captured amount is on its way (202), now seen by a client: frozen
		return a.frozen(ctx, w.cmd.ClientID, w.cmd.IdempotencyKey, k, false)
	}
	return a.inFlightReply()
}

// accepted answers 202 when the wait ran out, and stores it with the key
// (keyPath.keep) unless another request's claim or answer holds the key.
func (a *answerer) accepted(ctx context.Context, w waiting) reply {
	st, b := a.provisional(ctx, w.cmd)
	k, err := w.path.keep(ctx, w.claim, st, b)
	switch {
	case err != nil:
		return errReply(err)
	case k.InFlight: // another request's claim holds the key
		return a.inFlightReply()
	case k.TransferID != "" && k.TransferID != w.cmd.TransferID: // another request's answer
		if !bytes.Equal(k.Fingerprint, w.claim.Fingerprint) {
			return a.mismatch()
		}
		return a.replay(ctx, k, w.cmd.Topic())
	}
	return stored(k, false)
}

// provisional is the 202 of a request whose wait ran out: its transfer as
// it is now, or as requested while the ledger has not recorded it.
func (a *answerer) provisional(ctx context.Context, cmd ledger.Command) (int, []byte) {
	if t, err := a.cfg.Ledger.Transfer(ctx, cmd.TransferID); err == nil && t.ClientID == cmd.ClientID {
		return RespondTo(cmd, ledger.Result{Kind: ledger.Applied, Transfer: t})
	}
	b, _ := json.Marshal(TransferBody{ID: cmd.TransferID, From: cmd.From, To: cmd.To, Amount: cmd.Amount, Currency: cmd.Currency,
		Status: string(ledger.StatusPending), CreatedAt: cmd.CreatedAt.UTC()})
	return http.StatusAccepted, b
}

// lookup answers a request from its key as found without claiming it
// (LookupKey): false for a key the request may go on with.
func (a *answerer) lookup(ctx context.Context, claim KeyClaim, t ledger.Topic) (reply, bool) {
	k, outcome, err := a.cfg.Store.LookupKey(ctx, claim)
	if err != nil {
		return errReply(err), true
	}
	return a.fromKey(ctx, k, outcome, t)
}

// fromKey answers a request from its key as found (LookupKey, ResolveKey):
// 422 for another request's fingerprint, the stored answer replayed, or 409
// while in flight; false for a key the request may go on with. t is the
// request's topic.
func (a *answerer) fromKey(ctx context.Context, k IdempotencyKey, outcome KeyOutcome, t ledger.Topic) (reply, bool) {
	switch outcome {
	case KeyMismatch:
		return a.mismatch(), true
	case KeyReplay:
		return a.replay(ctx, k, t), true
	case KeyInFlight:
		return a.inFlightReply(), true
	}
	return reply{}, false
}

// mismatch is the answer to a key reused with another body.
func (a *answerer) mismatch() reply {
	a.stats.Mismatches.Add(1)
	return errReply(keyReused())
}

// keyReused is the refusal of a key reused with another body.
func keyReused() error {
	return ledger.Errorf(ledger.CodeIdempotencyKeyReused, "the Idempotency-Key was used for a different request")
}

// repeatAnswer is the answer to a repeat of cmd whose first result the
// ledger recorded (fingerprint: the first request's): that result, as the
// ledger answers a repeat, or 422 when the first was another request.
func repeatAnswer(cmd ledger.Command, fingerprint []byte, first ledger.Result) (int, []byte) {
	if !bytes.Equal(fingerprint, cmd.Fingerprint()) {
		return problem(keyReused())
	}
	return RespondTo(cmd, first)
}

// inFlightReply is the answer to a repeat while the first is in flight.
func (a *answerer) inFlightReply() reply {
	a.stats.InFlight.Add(1)
	rep := errReply(ledger.Errorf(CodeIdempotencyKeyInFlight, "a request with this Idempotency-Key is being processed"))
	rep.Header["Retry-After"] = "1"
	return rep
}

// replay answers a repeat of a request of topic t with the key's stored
// answer. The repeat is a duplicate the Idempotency-Key layer caught: a
// client's retry (the same key, a new request), as old as the key.
func (a *answerer) replay(ctx context.Context, k IdempotencyKey, t ledger.Topic) reply {
	a.stats.Replays.Add(1)
	a.stats.replayed(t)
	c := ledger.Caught{Topic: t, Layer: ledger.LayerIdempotencyKey, Cause: ledger.CauseClientRetry,
		Age: ledger.AgeOf(ledger.Command{CreatedAt: k.CreatedAt}, ledger.Result{}, a.cfg.Now())}
	span := trace.SpanFromContext(ctx)
	ledgerstream.RecordOutcome(span, a.cfg.Region, ledger.Result{Kind: ledger.Duplicate, Layer: ledger.LayerIdempotencyKey})
	dctx := ledgerstream.RecordCaught(ctx, span, c)
	if a.cfg.Duplicate != nil {
		a.cfg.Duplicate(dctx, c)
	}
	return a.frozen(ctx, k.ClientID, k.Key, k, true)
}

// frozen renders the answer stored with client's key (k as read). A
// provisional one (the ledger's 202) has now been seen by a client: it is
// made final first, so that everyone keeps getting it.
func (a *answerer) frozen(ctx context.Context, client, key string, k IdempotencyKey, replayed bool) reply {
	if !k.Final {
		var err error
		if k, err = a.cfg.Store.Answer(ctx, client, key, k.Status, k.Body, false); err != nil {
			return errReply(err)
		}
	}
	return stored(k, replayed)
}

// stored renders a key's stored response.
func stored(k IdempotencyKey, replayed bool) reply {
	rep := reply{Status: k.Status, Body: k.Body, Header: map[string]string{}}
	if k.Status >= 400 {
		rep.Header["Content-Type"] = "application/problem+json"
	}
	if k.Status == http.StatusCreated || k.Status == http.StatusAccepted {
		// The body names the transfer (after a key expired it is the
		// transfer the request made back then, not the key's new ID).
		if id := bodyID(k.Body); id != "" {
			rep.Header["Location"] = "/v1/transfers/" + id
		}
	}
	if replayed {
		rep.Header[HeaderReplayed] = "true"
	}
	return rep
}

// bodyID returns the "id" of a stored transfer body. The bodies paymesh
// stores start with it (TransferBody's first field, and IDs need no JSON
// escape), which is read without decoding the body; any other body is
// decoded.
func bodyID(body []byte) string {
	const prefix = `{"id":"`
	if rest, ok := bytes.CutPrefix(body, []byte(prefix)); ok {
		if end := bytes.IndexByte(rest, '"'); end > 0 && bytes.IndexByte(rest[:end], '\\') < 0 {
			return string(rest[:end])
		}
	}
	var t TransferBody
	if json.Unmarshal(body, &t) != nil {
		return ""
	}
	return t.ID
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
