package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// HeaderReplayed marks a response replayed from an idempotency key.
const HeaderReplayed = "Idempotent-Replayed"

func (s *Handler) postAccount(ctx context.Context, r *http.Request, client string) reply {
	body, err := s.readBody(r)
	if err != nil {
		return errReply(err)
	}
	var req AccountRequest
	if err := decodeStrict(body, &req, "currency", "floor", "region"); err != nil {
		return errReply(err)
	}
	home := req.Region
	if home == "" {
		home = s.cfg.Region
	}
	if _, ok := s.cfg.Regions.Code(home); !ok {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "unknown region %q", home))
	}
	return s.do(ctx, home, call{Op: "create_account", Client: client, Body: body})
}

func (s *Handler) createAccount(ctx context.Context, c call) reply {
	var req AccountRequest
	if err := decodeStrict(c.Body, &req, "currency", "floor", "region"); err != nil {
		return errReply(err)
	}
	cl, ok, err := s.cfg.Store.ClientByID(ctx, c.Client)
	if err != nil {
		return errReply(err)
	}
	if !ok || req.Floor < -cl.MaxOverdraft {
		return errReply(ledger.Errorf(ledger.CodeInvalidAmount, "floor %d is below the overdraft allowed to this client (-%d)", req.Floor, cl.MaxOverdraft))
	}
	a, err := s.cfg.Ledger.CreateAccount(ctx, ledger.NewAccount{ClientID: c.Client, Currency: req.Currency, Floor: req.Floor})
	if err != nil {
		return errReply(err)
	}
	s.accounts.remember(a)
	rep := jsonReply(http.StatusCreated, accountBody(a))
	rep.Header = map[string]string{"Location": "/v1/accounts/" + a.ID}
	return rep
}

func (s *Handler) getAccount(ctx context.Context, r *http.Request, client string) reply {
	id := r.PathValue("id")
	home, err := s.home(id)
	if err != nil {
		return errReply(ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", id))
	}
	return s.do(ctx, home, call{Op: "get_account", Client: client, ID: id})
}

// ownAccount reads an account of the client. Another client's account is
// answered exactly like a missing one: no object-level leak.
func (s *Handler) ownAccount(ctx context.Context, client, id string) (ledger.Account, error) {
	a, err := s.cfg.Ledger.Account(ctx, id)
	if err == nil && !ownedBy(a, client) {
		err = notFound(id)
	}
	return a, err
}

// ownedBy reports whether a is a customer account of client (false for
// the zero Account: a missing one).
func ownedBy(a ledger.Account, client string) bool {
	return a.ClientID == client && a.Kind == ledger.KindCustomer
}

func notFound(account string) error {
	return ledger.Errorf(ledger.CodeAccountNotFound, "account %s does not exist", account)
}

func (s *Handler) readAccount(ctx context.Context, c call) reply {
	a, err := s.ownAccount(ctx, c.Client, c.ID)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, accountBody(a))
}

func (s *Handler) getEntries(ctx context.Context, r *http.Request, client string) reply {
	id := r.PathValue("id")
	home, err := s.home(id)
	if err != nil {
		return errReply(ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", id))
	}
	c := call{Op: "list_entries", Client: client, ID: id, Limit: 50}
	q := r.URL.Query()
	if v := q.Get("after"); v != "" {
		if c.After, err = strconv.ParseInt(v, 10, 64); err != nil || c.After < 0 {
			return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "after=%q is not a version number", v))
		}
	}
	if v := q.Get("limit"); v != "" {
		if c.Limit, err = strconv.Atoi(v); err != nil || c.Limit < 1 || c.Limit > 500 {
			return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "limit=%q is not between 1 and 500", v))
		}
	}
	return s.do(ctx, home, c)
}

func (s *Handler) listEntries(ctx context.Context, c call) reply {
	if _, err := s.ownAccount(ctx, c.Client, c.ID); err != nil {
		return errReply(err)
	}
	ps, err := s.cfg.Ledger.PostingsPage(ctx, c.ID, c.After, c.Limit+1)
	if err != nil {
		return errReply(err)
	}
	page := EntriesBody{Entries: []EntryBody{}}
	for i, p := range ps {
		if i == c.Limit {
			next := ps[i-1].AccountVersion
			page.NextAfter = &next
			break
		}
		page.Entries = append(page.Entries, EntryBody{Version: p.AccountVersion, TransferID: p.TransferID, Leg: string(p.Leg),
			Amount: p.Amount, BalanceAfter: p.BalanceAfter})
	}
	return jsonReply(http.StatusOK, page)
}

// idempotencyKey returns the request's Idempotency-Key header, required on
// every request that moves money.
func idempotencyKey(r *http.Request) (string, error) {
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		return "", ledger.Errorf(ledger.CodeInvalidRequest, "give the Idempotency-Key header once")
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return "", ledger.Errorf(CodeIdempotencyKeyMissing, "%s %s requires an Idempotency-Key header", r.Method, r.URL.Path)
	}
	if len(key) > 255 {
		return "", ledger.Errorf(ledger.CodeInvalidRequest, "the Idempotency-Key is longer than 255 characters")
	}
	return key, nil
}

func (s *Handler) postTransfer(ctx context.Context, r *http.Request, client string) reply {
	key, err := idempotencyKey(r)
	if err != nil {
		return errReply(err)
	}
	body, err := s.readBody(r)
	if err != nil {
		return errReply(err)
	}
	req, err := DecodeTransferRequest(body)
	if err != nil {
		return errReply(err)
	}
	home, err := s.cfg.Regions.HomeRegion(req.From)
	if err != nil {
		return errReply(ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", req.From))
	}
	if _, err := s.cfg.Regions.HomeRegion(req.To); err != nil {
		return errReply(ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", req.To))
	}
	return s.do(ctx, home, call{Op: "create_transfer", Client: client, Key: key, Body: body, transfer: &req})
}

// transferRequest is the call's transfer request: the one its receiver
// decoded, or for a forwarded call its body decoded here.
func (c call) transferRequest() (TransferRequest, error) {
	if c.transfer != nil {
		return *c.transfer, nil
	}
	return DecodeTransferRequest(c.Body)
}

// createTransfer runs in the home region of the source account.
func (s *Handler) createTransfer(ctx context.Context, c call) reply {
	req, err := c.transferRequest()
	if err != nil {
		return errReply(err)
	}
	if err := validKey(c.Key); err != nil {
		return errReply(err)
	}
	id, err := s.cfg.IDs.NextString()
	if err != nil {
		return errReply(err)
	}
	now := s.cfg.Now()
	// Refuse here what the ledger would refuse, so that an accepted key
	// always leads to a recorded transfer. Another client's account is
	// refused first, as if it did not exist.
	probe := req.command(id, c.Client, c.Key, now)
	if err := probe.Validate(s.cfg.Region, s.cfg.Regions, now); err != nil {
		if _, oerr := s.ownAccount(ctx, c.Client, req.From); oerr != nil {
			return errReply(oerr)
		}
		if req.Hold {
			// A retry of a hold after the expiry it asked for is no longer
			// valid as new, but its key holds the first answer.
			if k, ok, kerr := s.cfg.Store.Key(ctx, c.Client, c.Key); kerr == nil && ok && !k.InFlight && bytes.Equal(k.Fingerprint, req.fingerprint()) {
				return s.replay(ctx, k)
			}
		}
		return errReply(err)
	}
	claim := KeyClaim{Client: c.Client, Key: c.Key, Fingerprint: req.fingerprint(), TransferID: id, Now: now,
		Lease: s.cfg.Wait + 5*time.Second, TTL: s.cfg.KeyTTL}
	if home, _ := s.cfg.Regions.HomeRegion(req.To); home == s.cfg.Region {
		// A destination here must exist before the key is claimed: the
		// ledger would not refuse a missing one but dead-letter it, to be
		// replayed once it exists, and the client would get a 202.
		claim.Destination = req.To
	}
	if !s.cfg.ClaimKeys {
		if !s.accounts.vouches(c.Client, req.From, claim.Destination) {
			// Accounts this process has not seen: read them (one round
			// trip shared with concurrent requests, no commit).
			st, err := s.cfg.Store.CheckAccounts(ctx, claim, req.From)
			if err != nil {
				return errReply(err)
			}
			if st.SourceFound {
				s.accounts.remember(st.Source)
			}
			if !ownedBy(st.Source, c.Client) {
				return errReply(notFound(req.From))
			}
			if st.DestinationMissing {
				return errReply(notFound(req.To))
			}
			if claim.Destination != "" {
				s.accounts.rememberExists(claim.Destination)
			}
		}
		return s.createUnclaimed(ctx, c, req, claim)
	}
	// Otherwise in one round trip: the owner check, a new key's claim and
	// the business-key lookup (StartKey), which teach this process the
	// accounts.
	st, err := s.cfg.Store.StartKey(ctx, claim, req.From)
	if err == nil && st.SourceFound {
		s.accounts.remember(st.Source)
	}
	if err == nil && claim.Destination != "" && !st.DestinationMissing {
		s.accounts.rememberExists(claim.Destination)
	}
	if err != nil { // the claim's outcome is unknown: check the accounts on their own (ResolveKey finds an own claim)
		if _, err := s.ownAccount(ctx, c.Client, req.From); err != nil {
			return errReply(err)
		}
		if claim.Destination != "" {
			if _, err := s.cfg.Ledger.Account(ctx, claim.Destination); err != nil {
				return errReply(err)
			}
		}
	} else if !ownedBy(st.Source, c.Client) {
		return errReply(notFound(req.From))
	} else if st.DestinationMissing {
		return errReply(notFound(req.To))
	}
	k, outcome, prior := st.Key, KeyNew, st.Prior // prior: the transfer the business key made (zero: none)
	if !st.Claimed {                              // the key exists, or the claim's outcome is unknown
		if k, outcome, err = s.cfg.Store.ResolveKey(ctx, claim); err != nil {
			return errReply(err)
		}
	}
	if rep, ok := s.fromKey(ctx, k, outcome); ok {
		return rep
	}
	cmd := req.command(k.TransferID, c.Client, c.Key, k.CreatedAt)
	// The ledger's business key outlives the idempotency key: a request
	// repeated after its key expired is answered with the transfer it made.
	if !st.Claimed { // not read with the claim
		if prior, _, err = s.cfg.Store.TransferByKey(ctx, c.Client, c.Key); err != nil {
			return errReply(err)
		}
	}
	if t := prior; t.ID != "" {
		st, b := Respond(ledger.Result{Kind: ledger.Duplicate, Transfer: t})
		if !bytes.Equal(t.Fingerprint, cmd.Fingerprint()) {
			st, b = problem(ledger.Errorf(ledger.CodeIdempotencyKeyReused, "the Idempotency-Key was used for a different request"))
		}
		if k, err = s.cfg.Store.Answer(ctx, c.Client, c.Key, st, b, false); err != nil {
			return errReply(err)
		}
		return stored(k, false)
	}
	// Wait before submitting, so that the ledger's notification cannot
	// come before the wait.
	answered, stop := s.keys.done(c.Client, c.Key)
	if _, err := s.cfg.Router.Submit(ctx, cmd); err != nil {
		stop()
		return errReply(err) // the key stays in flight; a retry after its lease takes it over
	}
	rep := s.await(ctx, cmd, claim, answered, stop, false, time.Now().Add(s.cfg.Wait))
	s.lately.add(clientKey{c.Client, c.Key}) // a retry on the unclaimed path reads the key, not submits
	return rep
}

// await waits for the ledger's stored response, and for a cross-region
// transfer (stored 202) for its final state, up to Wait. Whatever it answers
// is first stored with the key, so that a repeat gets exactly this answer.
// answered and stop are the key's wait (keyWaiter.done); claim is the
// request's, and unclaimed says that its key was not claimed (the API's own
// answer then makes the key's row).
func (s *Handler) await(ctx context.Context, cmd ledger.Command, claim KeyClaim, answered <-chan IdempotencyKey, stop func(), unclaimed bool, deadline time.Time) reply {
	client, key, transferID := cmd.ClientID, cmd.IdempotencyKey, cmd.TransferID
	// Until the ledger answered, wait with every other request (told by
	// the ledger, or one query for all of them, see keyWaiter); then read
	// the answer, and for a provisional 202 poll the transfer's state.
	wait := time.NewTimer(time.Until(deadline))
	var k IdempotencyKey
	ok, read := false, true // read: the key must be read (again)
	select {
	case k = <-answered:
		ok, read = true, false
	case <-wait.C:
	case <-ctx.Done():
	}
	wait.Stop()
	stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var err error
		if read {
			if k, ok, err = s.cfg.Store.Key(ctx, client, key); err != nil {
				return errReply(err)
			}
		}
		read = true
		if ok && !k.InFlight && k.TransferID != "" && k.TransferID != transferID {
			// Another request's answer: this one's key was answered before
			// (a repeat folded by the ledger's business key). The stored
			// row says whether it is this request's.
			k2, outcome, err := s.cfg.Store.LookupKey(ctx, claim)
			switch {
			case err != nil:
				return errReply(err)
			case outcome == KeyMismatch:
				return s.mismatch()
			case outcome == KeyReplay:
				return s.replay(ctx, k2)
			}
			k, ok = k2, outcome != KeyNew // in flight again (taken over): wait on
		}
		if ok && !k.InFlight && (k.Final || k.Status != http.StatusAccepted) {
			if !k.Final {
				if k, err = s.cfg.Store.Answer(ctx, client, key, k.Status, k.Body, false); err != nil {
					return errReply(err)
				}
			}
			return stored(k, false)
		}
		if ok && !k.InFlight { // a provisional 202: wait for the final state
			if t, err := s.cfg.Ledger.Transfer(ctx, transferID); err == nil && t.ClientID == client && t.Status != ledger.StatusDebited {
				st, b := RespondTo(cmd, ledger.Result{Kind: ledger.Applied, Transfer: t})
				if k, err = s.cfg.Store.Answer(ctx, client, key, st, b, true); err != nil {
					return errReply(err)
				}
				return stored(k, false)
			}
		}
		if time.Now().After(deadline) && cmd.IsAction() {
			// A capture or void is not answered before its ledger decided
			// it: the hold's state says nothing of which request won. The
			// key holds no answer yet, so a retry gets the decision.
			if ok && !k.InFlight { // decided: the captured amount is on its way (202), now seen by a client: frozen
				if k, err = s.cfg.Store.Answer(ctx, client, key, k.Status, k.Body, false); err != nil {
					return errReply(err)
				}
				return stored(k, false)
			}
			return s.inFlightReply()
		}
		if time.Now().After(deadline) {
			st, b := http.StatusAccepted, []byte(nil)
			if t, err := s.cfg.Ledger.Transfer(ctx, transferID); err == nil && t.ClientID == client {
				st, b = RespondTo(cmd, ledger.Result{Kind: ledger.Applied, Transfer: t})
			} else {
				b, _ = json.Marshal(TransferBody{ID: transferID, From: cmd.From, To: cmd.To, Amount: cmd.Amount, Currency: cmd.Currency,
					Status: string(ledger.StatusPending), CreatedAt: cmd.CreatedAt.UTC()})
			}
			var k IdempotencyKey
			if unclaimed {
				k, err = s.cfg.Store.AnswerUnclaimed(ctx, claim, st, b)
			} else {
				k, err = s.cfg.Store.Answer(ctx, client, key, st, b, false)
			}
			switch {
			case err != nil:
				return errReply(err)
			case k.InFlight: // another request's claim holds the key
				return s.inFlightReply()
			case k.TransferID != "" && k.TransferID != transferID: // another request's answer
				if !bytes.Equal(k.Fingerprint, claim.Fingerprint) {
					return s.mismatch()
				}
				return s.replay(ctx, k)
			}
			return stored(k, false)
		}
		select {
		case <-ctx.Done():
			return errReply(ctx.Err())
		case <-tick.C:
		}
	}
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

func validKey(key string) error {
	for _, r := range key {
		if r == ' ' {
			return ledger.Errorf(ledger.CodeInvalidRequest, "the Idempotency-Key must not contain spaces")
		}
	}
	return ledger.ValidIdempotencyKey(key)
}

func (s *Handler) getTransfer(ctx context.Context, r *http.Request, client string) reply {
	id := r.PathValue("id")
	home, err := s.home(id)
	if err != nil {
		return errReply(err)
	}
	return s.do(ctx, home, call{Op: "get_transfer", Client: client, ID: id})
}

func (s *Handler) readTransfer(ctx context.Context, c call) reply {
	t, err := s.cfg.Ledger.Transfer(ctx, c.ID)
	if err == nil && t.ClientID != c.Client {
		err = ledger.Errorf(ledger.CodeNotFound, "transfer %s does not exist", c.ID)
	}
	if err != nil {
		return errReply(err)
	}
	body := transferBody(t)
	ps, err := s.cfg.Ledger.TransferPostings(ctx, t.ID)
	if err != nil {
		return errReply(err)
	}
	if t.RefundOf == "" && (t.Status == ledger.StatusCompleted || t.Status == ledger.StatusDebited) {
		refunds, total, err := s.cfg.Ledger.Refunds(ctx, t.ID)
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
