package api

import (
	"context"
	"net/http"
	"sync"

	"github.com/paymesh/paymesh/services/ledger"
)

// accounts serves /v1/accounts: open an account in a region, read one,
// page through its change-log. Each runs in the account's home region, for
// the client that owns it; another client's account is answered as a
// missing one.
type accounts struct {
	cfg  *Config
	fwd  *forwarder
	seen *accountCache
	// The operations run in the account's home region.
	create, read, entries operation
}

func newAccounts(cfg *Config, fwd *forwarder, seen *accountCache) *accounts {
	a := &accounts{cfg: cfg, fwd: fwd, seen: seen}
	a.create = operation{name: "create_account", run: a.createHere, takes: shape{body: requiredBody}}
	a.read = operation{name: "get_account", run: a.readHere, takes: shape{id: idHere}}
	a.entries = operation{name: "list_entries", run: a.listHere, takes: shape{id: idHere, page: true}}
	return a
}

// post serves POST /v1/accounts.
func (a *accounts) post(ctx context.Context, r *http.Request, client string) reply {
	body, err := readBody(r)
	if err != nil {
		return errReply(err)
	}
	var req AccountRequest
	if err := decodeStrict(body, &req, "currency", "floor", "region"); err != nil {
		return errReply(err)
	}
	home := req.Region
	if home == "" {
		home = a.cfg.Region
	}
	if _, ok := a.cfg.Regions.Code(home); !ok {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "unknown region %q", home))
	}
	return a.fwd.do(ctx, home, a.create, Call{Client: client, Body: body})
}

func (a *accounts) createHere(ctx context.Context, c Call) reply {
	var req AccountRequest
	if err := decodeStrict(c.Body, &req, "currency", "floor", "region"); err != nil {
		return errReply(err)
	}
	if req.Region != "" && req.Region != a.cfg.Region {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "an account of region %.16q is opened there, not in %s", req.Region, a.cfg.Region))
	}
	cl, ok, err := a.cfg.Store.ClientByID(ctx, c.Client)
	if err != nil {
		return errReply(err)
	}
	if !ok || req.Floor < -cl.MaxOverdraft {
		return errReply(ledger.Errorf(ledger.CodeInvalidAmount, "floor %d is below the overdraft allowed to this client (-%d)", req.Floor, cl.MaxOverdraft))
	}
	acct, err := a.cfg.Ledger.CreateAccount(ctx, ledger.NewAccount{ClientID: c.Client, Currency: req.Currency, Floor: req.Floor})
	if err != nil {
		return errReply(err)
	}
	a.seen.remember(acct)
	rep := jsonReply(http.StatusCreated, accountBody(acct))
	rep.Header = map[string]string{"Location": "/v1/accounts/" + acct.ID}
	return rep
}

// get serves GET /v1/accounts/{id}.
func (a *accounts) get(ctx context.Context, r *http.Request, client string) reply {
	id := r.PathValue("id")
	home, err := a.fwd.home(id)
	if err != nil {
		return errReply(ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", id))
	}
	return a.fwd.do(ctx, home, a.read, Call{Client: client, ID: id})
}

func (a *accounts) readHere(ctx context.Context, c Call) reply {
	acct, err := ownAccount(ctx, a.cfg.Ledger, c.Client, c.ID)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, accountBody(acct))
}

// getEntries serves GET /v1/accounts/{id}/entries.
func (a *accounts) getEntries(ctx context.Context, r *http.Request, client string) reply {
	id := r.PathValue("id")
	home, err := a.fwd.home(id)
	if err != nil {
		return errReply(ledger.Errorf(ledger.CodeAccountNotFound, "account %q does not exist", id))
	}
	c := Call{Client: client, ID: id, Limit: 50}
	q := r.URL.Query()
	if v := q.Get("after"); v != "" {
		if c.After, err = parseAfter(v); err != nil {
			return errReply(err)
		}
	}
	if v := q.Get("limit"); v != "" {
		if c.Limit, err = parseLimit(v); err != nil {
			return errReply(err)
		}
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

// entriesPage is the page of up to limit entries of ps, read with one more
// row than the page holds: that row, if there, means a next page. A limit
// below 1 (refused before a page is read) is a page of one entry, never an
// index before the first.
func entriesPage(ps []ledger.Posting, limit int) EntriesBody {
	limit = max(limit, 1)
	page := EntriesBody{Entries: []EntryBody{}}
	for _, p := range ps[:min(len(ps), limit)] {
		page.Entries = append(page.Entries, EntryBody{Version: p.AccountVersion, TransferID: p.TransferID, Leg: string(p.Leg),
			Amount: p.Amount, BalanceAfter: p.BalanceAfter})
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
