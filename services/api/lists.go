package api

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// lists serves GET /v1/transfers and GET /v1/accounts: a client's
// transfers and accounts, newest first, a page at a time, across regions.
// A client's transfers live in the regions of their source accounts, and
// its accounts in their own regions, so a list asks every region for its
// first page after the cursor (limit+1 rows, in parallel) and merges the
// pages by (created_at, id). The cursor is the last row's (created_at,
// id), the same for every region, so the next page starts below it
// everywhere: no row is repeated, and every row that was there when the
// first page was read is listed once. A row committed meanwhile is listed
// when its created_at (the time the API took the request) falls below the
// position the pages have reached, and not otherwise.
type lists struct {
	cfg                         *Config
	fwd                         *forwarder
	transfers, accounts, events operation
}

func newLists(cfg *Config, fwd *forwarder) *lists {
	l := &lists{cfg: cfg, fwd: fwd}
	l.transfers = operation{name: "list_transfers", run: l.transfersHere, takes: shape{page: true, list: true}}
	l.accounts = operation{name: "list_accounts", run: l.accountsHere, takes: shape{page: true, list: true}}
	l.events = operation{name: "list_events", run: l.eventsHere, takes: shape{page: true, list: true}}
	return l
}

// defaultListLimit is a list page's length when the request names none.
const defaultListLimit = 20

// ListQuery is what a list selects; it travels in a list's forwarded call.
type ListQuery struct {
	Account  string `json:"account,omitempty"`
	Status   string `json:"status,omitempty"`
	Currency string `json:"currency,omitempty"`
	// Reference and Metadata select by the client's labels: metadata
	// holds each key given with its value (metadata[key]=value).
	Reference string            `json:"reference,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// CreatedFrom and CreatedTo bound created_at: [from, to).
	CreatedFrom *time.Time `json:"created_gte,omitempty"`
	CreatedTo   *time.Time `json:"created_lt,omitempty"`
	// After is the decoded cursor of the page before.
	After *ledger.ListCursor `json:"after,omitempty"`
	// Types and EventsAfter select events (list_events): their types
	// (none: all), and the position in the region's feed to read after.
	Types       []string              `json:"types,omitempty"`
	EventsAfter *ledger.EventPosition `json:"events_after,omitempty"`
}

// TransferList is a page of GET /v1/transfers.
type TransferList struct {
	Transfers []TransferBody `json:"transfers"`
	// NextCursor is the cursor of the next page; absent on the last.
	NextCursor string `json:"next_cursor,omitempty"`
}

// AccountList is a page of GET /v1/accounts.
type AccountList struct {
	Accounts   []AccountBody `json:"accounts"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// getTransfers serves GET /v1/transfers?account=&status=&reference=&metadata[key]=&created_gte=&created_lt=&limit=&cursor=.
func (l *lists) getTransfers(ctx context.Context, r *http.Request, client string) reply {
	q, limit, err := l.readQuery(r.URL.RawQuery, "account", "status", "reference", "metadata[key]", "created_gte", "created_lt")
	if err != nil {
		return errReply(err)
	}
	// Every region, an account's list too: a transfer lives in its
	// source's region, so the transfers into an account are in the
	// regions they came from.
	regions := l.cfg.Regions.Names()
	replies := l.fanOut(ctx, regions, l.transfers, Call{Client: client, Limit: limit, List: &q})
	page, next, failed := merge(l.fwd, regions, replies, limit, func(b []byte) ([]TransferBody, error) {
		var p TransferList
		err := json.Unmarshal(b, &p)
		return p.Transfers, err
	}, func(t TransferBody) (time.Time, string) { return t.CreatedAt, t.ID })
	if failed != nil {
		return *failed
	}
	return jsonReply(http.StatusOK, TransferList{Transfers: page, NextCursor: next})
}

// getAccounts serves GET /v1/accounts?currency=&reference=&metadata[key]=&limit=&cursor=.
func (l *lists) getAccounts(ctx context.Context, r *http.Request, client string) reply {
	q, limit, err := l.readQuery(r.URL.RawQuery, "currency", "reference", "metadata[key]")
	if err != nil {
		return errReply(err)
	}
	regions := l.cfg.Regions.Names()
	replies := l.fanOut(ctx, regions, l.accounts, Call{Client: client, Limit: limit, List: &q})
	page, next, failed := merge(l.fwd, regions, replies, limit, func(b []byte) ([]AccountBody, error) {
		var p AccountList
		err := json.Unmarshal(b, &p)
		return p.Accounts, err
	}, func(a AccountBody) (time.Time, string) { return a.CreatedAt, a.ID })
	if failed != nil {
		return *failed
	}
	return jsonReply(http.StatusOK, AccountList{Accounts: page, NextCursor: next})
}

// merge merges the regions' pages (replies, in regions' order), newest
// first by key, and returns the first limit items and the cursor of the
// next page ("" for none). A region's failure is the list's (failed); a
// page that does not decode, or holds an item homed elsewhere, is an
// internal error: a peer's answer is checked as any input from it.
func merge[T any](f *forwarder, regions []string, replies []reply, limit int, items func([]byte) ([]T, error), key func(T) (time.Time, string)) ([]T, string, *reply) {
	all := []T{}
	for i, rep := range replies {
		if rep.Status != http.StatusOK {
			return nil, "", &rep
		}
		page, err := items(rep.Body)
		for _, it := range page {
			if _, id := key(it); err == nil {
				if home, herr := f.homeOf("id", id); herr != nil || home != regions[i] {
					err = fmt.Errorf("%s is not homed there", id)
				}
			}
		}
		if err != nil {
			failed := errReply(fmt.Errorf("list: region %s answered a page that is not its own: %w", regions[i], err))
			return nil, "", &failed
		}
		all = append(all, page...)
	}
	slices.SortFunc(all, func(a, b T) int {
		at1, id1 := key(a)
		at2, id2 := key(b)
		if c := at2.Compare(at1); c != 0 {
			return c
		}
		return cmp.Compare(id2, id1)
	})
	if len(all) <= limit {
		return all, "", nil
	}
	at, id := key(all[limit-1])
	return all[:limit], EncodeCursor(at, id), nil
}

// fanOut runs op with c in every region at once and returns the replies
// in regions' order.
func (l *lists) fanOut(ctx context.Context, regions []string, op operation, c Call) []reply {
	out := make([]reply, len(regions))
	var wg sync.WaitGroup
	for i, region := range regions {
		wg.Go(func() { out[i] = l.fwd.do(ctx, region, op, c) })
	}
	wg.Wait()
	return out
}

// readQuery reads a list's raw query: the filters named (each a query
// parameter), limit (1 to MaxPageLimit, default defaultListLimit) and
// cursor. Any other parameter is refused, so a misspelt filter is not
// silently ignored.
func (l *lists) readQuery(raw string, filters ...string) (ListQuery, int, error) {
	var q ListQuery
	v, err := url.ParseQuery(raw)
	if err != nil {
		return q, 0, ledger.Errorf(ledger.CodeInvalidRequest, "the query does not parse: %v", err)
	}
	limit := defaultListLimit
	now := time.Now()
	for name, vals := range v {
		if len(vals) != 1 {
			return q, 0, ledger.Errorf(ledger.CodeInvalidRequest, "give %s once", name)
		}
		val := vals[0]
		if key, ok := metadataParam(name); ok && slices.Contains(filters, "metadata[key]") {
			if q.Metadata == nil {
				q.Metadata = map[string]string{}
			}
			q.Metadata[key] = val
			continue
		}
		if name != "limit" && name != "cursor" && !slices.Contains(filters, name) {
			return q, 0, ledger.Errorf(ledger.CodeInvalidRequest, "unknown query parameter %.32q (this list takes %s, limit, cursor)", name, strings.Join(filters, ", "))
		}
		var err error
		switch name {
		case "limit":
			limit, err = parseLimit(val)
		case "cursor":
			q.After, err = l.decodeCursor(val)
		case "account":
			q.Account = val
		case "status":
			q.Status = val
		case "currency":
			q.Currency = val
		case "reference":
			q.Reference = val
		case "created_gte", "created_lt":
			var t time.Time
			if t, err = time.Parse(time.RFC3339Nano, val); err != nil {
				err = ledger.Errorf(ledger.CodeInvalidRequest, "%s=%.40q is not an RFC 3339 time", name, val)
			} else if name == "created_gte" {
				q.CreatedFrom = &t
			} else {
				q.CreatedTo = &t
			}
		}
		if err != nil {
			return q, 0, err
		}
	}
	return q, limit, l.fwd.checkList(q, now)
}

// metadataParam returns the key of a metadata[key] query parameter.
func metadataParam(name string) (string, bool) {
	key, ok := strings.CutPrefix(name, "metadata[")
	if !ok || !strings.HasSuffix(key, "]") {
		return "", false
	}
	return strings.TrimSuffix(key, "]"), true
}

// EncodeCursor makes the opaque cursor of a list's page that ends at
// (createdAt, id).
func EncodeCursor(createdAt time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(createdAt.UTC().Format(time.RFC3339Nano) + "|" + id))
}

// decodeCursor reads a cursor EncodeCursor made; anything else, tampered
// or made up, is an invalid request.
func (l *lists) decodeCursor(v string) (*ledger.ListCursor, error) {
	bad := ledger.Errorf(ledger.CodeInvalidRequest, "cursor %.40q is not one a list of this API gave", v)
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return nil, bad
	}
	at, id, ok := strings.Cut(string(b), "|")
	if !ok {
		return nil, bad
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return nil, bad
	}
	if _, err := l.fwd.homeOf("cursor", id); err != nil {
		return nil, bad
	}
	return &ledger.ListCursor{CreatedAt: t, ID: id}, nil
}

// transfersHere answers this region's first page of the client's
// transfers that c.List selects, limit+1 rows (the one more tells the
// merge there is a next page).
func (l *lists) transfersHere(ctx context.Context, c Call) reply {
	f := ledger.TransferFilter{ClientID: c.Client, Account: c.List.Account, Status: ledger.Status(c.List.Status),
		CreatedFrom: c.List.CreatedFrom, CreatedTo: c.List.CreatedTo, After: c.List.After, Reference: c.List.Reference, Metadata: c.List.Metadata}
	ts, err := l.cfg.Ledger.TransfersPage(ctx, f, min(max(c.Limit, 1), MaxPageLimit)+1)
	if err != nil {
		return errReply(err)
	}
	page := TransferList{Transfers: make([]TransferBody, 0, len(ts))}
	for _, t := range ts {
		page.Transfers = append(page.Transfers, transferBody(t))
	}
	return jsonReply(http.StatusOK, page)
}

// accountsHere answers this region's first page of the client's accounts.
func (l *lists) accountsHere(ctx context.Context, c Call) reply {
	f := ledger.AccountFilter{ClientID: c.Client, Currency: c.List.Currency, Reference: c.List.Reference, Metadata: c.List.Metadata,
		After: c.List.After}
	as, err := l.cfg.Ledger.AccountsPage(ctx, f, min(max(c.Limit, 1), MaxPageLimit)+1)
	if err != nil {
		return errReply(err)
	}
	page := AccountList{Accounts: make([]AccountBody, 0, len(as))}
	for _, a := range as {
		page.Accounts = append(page.Accounts, accountBody(a))
	}
	return jsonReply(http.StatusOK, page)
}
