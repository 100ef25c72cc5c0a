package api

import (
	"cmp"
	"context"
	"hash/fnv"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// accounts serves /v1/accounts: open an account in a region, read one,
// page through its change-log. Each runs in the account's home region, for
// the client that owns it; another client's account is answered as a
// missing one.
//
// Opening an account is safe to retry under an Idempotency-Key (optional:
// without one, each request opens an account). The key's home region
// (AccountKeyHome) records where its first request opens the account
// (claim: the body's region, or the region the request was sent to), and
// every retry, wherever it is sent, opens it there: that region's ledger
// keeps the key with the account, unique per client, so the first request
// and its retries open one account, and each gets the same answer.
type accounts struct {
	cfg  *Config
	fwd  *forwarder
	seen *accountCache
	// The operations run in the account's home region (create, read,
	// entries, statement) or in its key's (claim).
	create, claim, read, entries, statement operation
}

func newAccounts(cfg *Config, fwd *forwarder, seen *accountCache) *accounts {
	a := &accounts{cfg: cfg, fwd: fwd, seen: seen}
	a.create = operation{name: "create_account", run: a.createHere, takes: shape{key: optionalKey, body: requiredBody, region: true}}
	a.claim = operation{name: "claim_account_key", run: a.claimHere, takes: shape{key: requiredKey, body: requiredBody, region: true}}
	a.read = operation{name: "get_account", run: a.readHere, takes: shape{id: idHere, at: true}}
	a.entries = operation{name: "list_entries", run: a.listHere, takes: shape{id: idHere, page: true}}
	a.statement = operation{name: "get_statement", run: a.statementHere, takes: shape{id: idHere, page: true, period: true}}
	return a
}

// post serves POST /v1/accounts.
func (a *accounts) post(ctx context.Context, r *http.Request, client string) reply {
	key, err := keyIfAny(r)
	if err != nil {
		return errReply(err)
	}
	body, err := readBody(r)
	if err != nil {
		return errReply(err)
	}
	req, err := decodeAccount(body)
	if err == nil {
		// Refused here, a request claims no key: the key stays free.
		err = a.check(ctx, client, req)
	}
	if err != nil {
		return errReply(err)
	}
	home := req.Region
	if home == "" {
		home = a.cfg.Region
	}
	if _, ok := a.cfg.Regions.Code(home); !ok {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "unknown region %q", home))
	}
	if key == "" {
		return a.fwd.do(ctx, home, a.create, Call{Client: client, Body: body})
	}
	c := Call{Client: client, Key: key, Body: body, Region: a.cfg.Region}
	return a.fwd.do(ctx, AccountKeyHome(a.cfg.Regions.Names(), client, key), a.claim, c)
}

// AccountKeyHome returns the region, of regions, that records where a
// client's account key opens its account: the same for every request with
// the key, wherever it is sent (FNV-1a of the client and the key).
func AccountKeyHome(regions []string, client, key string) string {
	h := fnv.New32a()
	io.WriteString(h, client)
	h.Write([]byte{0})
	io.WriteString(h, key)
	return regions[h.Sum32()%uint32(len(regions))]
}

// decodeAccount decodes and checks the body of POST /v1/accounts.
func decodeAccount(body []byte) (AccountRequest, error) {
	var req AccountRequest
	if err := decodeStrict(body, &req, "currency", "floor", "region", "reference", "metadata"); err != nil {
		return req, err
	}
	return req, validLabels(req.Reference, req.Metadata)
}

// claimHere runs in the key's home region: it records, or finds, the
// region the key's first request chose (c.Region when the body names
// none), and opens the account there under the key.
func (a *accounts) claimHere(ctx context.Context, c Call) reply {
	req, err := decodeAccount(c.Body)
	if err != nil {
		return errReply(err)
	}
	region := req.Region
	if region == "" {
		region = c.Region
	}
	if _, ok := a.cfg.Regions.Code(region); !ok {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "unknown region %q", region))
	}
	first, err := a.cfg.Store.ClaimAccountKey(ctx, c.Client, c.Key, req.fingerprint(), region)
	if err != nil {
		return errReply(err)
	}
	return a.fwd.do(ctx, first, a.create, Call{Client: c.Client, Key: c.Key, Body: c.Body, Region: first})
}

func (a *accounts) createHere(ctx context.Context, c Call) reply {
	req, err := decodeAccount(c.Body)
	if err != nil {
		return errReply(err)
	}
	if region := cmp.Or(req.Region, c.Region); region != "" && region != a.cfg.Region {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "an account of region %.16q is opened there, not in %s", region, a.cfg.Region))
	}
	if err := a.check(ctx, c.Client, req); err != nil {
		return errReply(err)
	}
	n := ledger.NewAccount{ClientID: c.Client, Currency: req.Currency, Floor: req.Floor, Reference: req.Reference, Metadata: req.Metadata}
	if c.Key != "" {
		n.IdempotencyKey, n.RequestHash = c.Key, req.fingerprint()
	}
	acct, created, err := a.cfg.Ledger.CreateAccount(ctx, n)
	if err != nil {
		return errReply(err)
	}
	a.seen.remember(acct)
	rep := jsonReply(http.StatusCreated, openedBody(acct))
	rep.Header = map[string]string{"Location": "/v1/accounts/" + acct.ID}
	if !created {
		rep.Header[HeaderReplayed] = "true"
	}
	return rep
}

// check refuses an account request the ledger would refuse (currency,
// floor), and a floor below the overdraft the client is allowed (every
// region has the client's registration).
func (a *accounts) check(ctx context.Context, client string, req AccountRequest) error {
	if err := (ledger.NewAccount{ClientID: client, Currency: req.Currency, Floor: req.Floor}).Validate(); err != nil {
		return err
	}
	cl, ok, err := a.cfg.Store.ClientByID(ctx, client)
	if err != nil {
		return err
	}
	if !ok || req.Floor < -cl.MaxOverdraft {
		return ledger.Errorf(ledger.CodeInvalidAmount, "floor %d is below the overdraft allowed to this client (-%d)", req.Floor, cl.MaxOverdraft)
	}
	return nil
}

// openedBody is the answer to the request that opened a: the account as
// it was opened (nothing on it yet), so that a retry under its key, later,
// gets the same answer.
func openedBody(a ledger.Account) AccountBody {
	return accountBody(ledger.Account{ID: a.ID, ClientID: a.ClientID, Kind: a.Kind, Currency: a.Currency, Floor: a.Floor, CreatedAt: a.CreatedAt,
		Reference: a.Reference, Metadata: a.Metadata})
}

// home returns the account of a request's path and its home region; an
// ID homed nowhere is a missing account.
func (a *accounts) home(r *http.Request) (id, home string, err error) {
	id = r.PathValue("id")
	if home, err = a.fwd.home(id); err != nil {
		return "", "", ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", id)
	}
	return id, home, nil
}

// get serves GET /v1/accounts/{id}.
func (a *accounts) get(ctx context.Context, r *http.Request, client string) reply {
	id, home, err := a.home(r)
	if err != nil {
		return errReply(err)
	}
	c := Call{Client: client, ID: id}
	if v := r.URL.Query().Get("as_of"); v != "" {
		at, err := parseInstant("as_of", v, time.Now())
		if err != nil {
			return errReply(err)
		}
		c.At = &at
	}
	return a.fwd.do(ctx, home, a.read, c)
}

// readHere answers the account, or with c.At its balance at that instant.
func (a *accounts) readHere(ctx context.Context, c Call) reply {
	acct, err := ownAccount(ctx, a.cfg.Ledger, c.Client, c.ID)
	if err != nil {
		return errReply(err)
	}
	if c.At == nil {
		return jsonReply(http.StatusOK, accountBody(acct))
	}
	b, err := a.cfg.Ledger.BalanceAt(ctx, acct.ID, *c.At)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, AccountAsOfBody{ID: acct.ID, Currency: acct.Currency, AsOf: c.At.UTC(), Balance: b.Balance, Held: b.Held,
		Available: b.Available(), Version: b.Version})
}

// getStatement serves GET /v1/accounts/{id}/statement?from=&to= (to: now
// by default), a page at a time (after, limit).
func (a *accounts) getStatement(ctx context.Context, r *http.Request, client string) reply {
	id, home, err := a.home(r)
	if err != nil {
		return errReply(err)
	}
	c := Call{Client: client, ID: id, Limit: 100}
	q := r.URL.Query()
	now := time.Now()
	if q.Get("from") == "" {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "a statement needs from= (RFC 3339), and to= (default: now)"))
	}
	from, err := parseInstant("from", q.Get("from"), now)
	if err != nil {
		return errReply(err)
	}
	to := now
	if v := q.Get("to"); v != "" {
		if to, err = parseInstant("to", v, now); err != nil {
			return errReply(err)
		}
	}
	if err := checkPeriod(from, to, now); err != nil {
		return errReply(err)
	}
	c.From, c.To = &from, &to
	if err := readPage(q, &c); err != nil {
		return errReply(err)
	}
	return a.fwd.do(ctx, home, a.statement, c)
}

func (a *accounts) statementHere(ctx context.Context, c Call) reply {
	acct, err := ownAccount(ctx, a.cfg.Ledger, c.Client, c.ID)
	if err != nil {
		return errReply(err)
	}
	limit := min(max(c.Limit, 1), MaxPageLimit)
	st, err := a.cfg.Ledger.Statement(ctx, acct.ID, *c.From, *c.To, c.After, limit+1)
	if err != nil {
		return errReply(err)
	}
	page := entriesPage(st.Entries, limit)
	return jsonReply(http.StatusOK, StatementBody{Account: acct.ID, Currency: acct.Currency, From: c.From.UTC(), To: c.To.UTC(),
		OpeningBalance: st.Opening, ClosingBalance: st.Closing, Entries: page.Entries, NextAfter: page.NextAfter})
}

// getEntries serves GET /v1/accounts/{id}/entries.
func (a *accounts) getEntries(ctx context.Context, r *http.Request, client string) reply {
	id, home, err := a.home(r)
	if err != nil {
		return errReply(err)
	}
	c := Call{Client: client, ID: id, Limit: 50}
	if err := readPage(r.URL.Query(), &c); err != nil {
		return errReply(err)
	}
	return a.fwd.do(ctx, home, a.entries, c)
}

func (a *accounts) listHere(ctx context.Context, c Call) reply {
	if _, err := ownAccount(ctx, a.cfg.Ledger, c.Client, c.ID); err != nil {
		return errReply(err)
	}
	// The limit was checked where the call was read (checkLimit); kept in
	// range here too, the read and the page agree whatever got through.
	limit := min(max(c.Limit, 1), MaxPageLimit)
	ps, err := a.cfg.Ledger.PostingsPage(ctx, c.ID, c.After, limit+1)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, entriesPage(ps, limit))
}

// readPage reads the page of a list of entries from a query into c: after
// (a version cursor) and limit (1 to MaxPageLimit), each when given.
func readPage(q url.Values, c *Call) error {
	var err error
	if v := q.Get("after"); v != "" {
		if c.After, err = parseAfter(v); err != nil {
			return err
		}
	}
	if v := q.Get("limit"); v != "" {
		if c.Limit, err = parseLimit(v); err != nil {
			return err
		}
	}
	return nil
}

// entriesPage is the page of up to limit entries of ps, read with one more
// row than the page holds: that row, if there, means a next page. A limit
// below 1 (refused before a page is read) is a page of one entry, never an
// index before the first.
func entriesPage(ps []ledger.Posting, limit int) EntriesBody {
	limit = max(limit, 1)
	page := EntriesBody{Entries: []EntryBody{}}
	for _, p := range ps[:min(len(ps), limit)] {
		page.Entries = append(page.Entries, entryBody(p))
	}
	if len(ps) > limit {
		next := ps[limit-1].AccountVersion
		page.NextAfter = &next
	}
	return page
}

// ownAccount reads an account of the client. Another client's account is
// answered exactly like a missing one: no object-level leak.
func ownAccount(ctx context.Context, l Ledger, client, id string) (ledger.Account, error) {
	a, err := l.Account(ctx, id)
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

// accountCache remembers accounts this process read: who owns them, or
// that they are the region's own. An account's owner and kind never change
// and accounts are never deleted, so an entry is never stale; the cache
// only bounds its size.
type accountCache struct {
	mu    sync.RWMutex
	owner map[string]string // account ID -> its client if a customer account, "" when unknown, systemOwner for the region's own
}

// systemOwner marks the region's own accounts (issuance, transit) in the
// cache: no client ID can spell it.
const systemOwner = "\x00system"

// maxAccountCache bounds the accounts remembered; the cache starts over when
// it is full.
const maxAccountCache = 1 << 17

func (c *accountCache) remember(a ledger.Account) {
	owner := systemOwner
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

// rememberCustomer records that account id is a customer account (its
// owner unknown: it is not vouched for as anyone's source).
func (c *accountCache) rememberCustomer(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.room()
	if _, ok := c.owner[id]; !ok {
		c.owner[id] = ""
	}
}

// vouches reports whether source is known as a customer account of client
// and destination ("" for none to check) as a customer account.
func (c *accountCache) vouches(client, source, destination string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if owner, ok := c.owner[source]; !ok || owner == "" || owner != client {
		return false
	}
	if destination == "" {
		return true
	}
	owner, ok := c.owner[destination]
	return ok && owner != systemOwner
}

// learn remembers what a read of a transfer request's accounts found
// (Store.CheckAccounts, Store.StartKey), and refuses the request unless its
// source is a customer account of its client and its destination here, if
// it names one (KeyClaim.Destination), is a customer account. The region's
// own accounts are refused by name (system_account); an account that is
// another client's is not found, as one that does not exist.
func (c *accountCache) learn(st KeyStart, x newTransfer) error {
	if st.SourceFound {
		c.remember(st.Source)
	}
	if x.claim.Destination != "" && !st.DestinationMissing && !st.DestinationSystem {
		c.rememberCustomer(x.claim.Destination)
	}
	switch {
	case st.SourceFound && st.Source.Kind != ledger.KindCustomer:
		return systemAccount(x.req.From)
	case !ownedBy(st.Source, x.claim.Client):
		return notFound(x.req.From)
	case st.DestinationMissing:
		return notFound(x.req.To)
	case st.DestinationSystem:
		return systemAccount(x.req.To)
	}
	return nil
}

func systemAccount(account string) error {
	return ledger.Errorf(ledger.CodeSystemAccount, "account %s is one of the region's own accounts: clients pay from and into customer accounts only", account)
}
