package chaos

import (
	"context"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// onAPI makes every region's API configuration go through change, after
// the changes installed before it.
func onAPI(c *cluster.Config, change func(*apid.Config)) {
	prev := c.API
	c.API = func(region string, ac *apid.Config) {
		if prev != nil {
			prev(region, ac)
		}
		change(ac)
	}
}

// wrapAPIStore installs wrap around every region's API store, after the
// decorators installed before it (through the API's WrapStore seam).
func wrapAPIStore(c *cluster.Config, wrap func(api.Store) api.Store) {
	onAPI(c, func(ac *apid.Config) {
		inner := ac.WrapStore
		ac.WrapStore = func(s api.Store) api.Store {
			if inner != nil {
				s = inner(s)
			}
			return wrap(s)
		}
	})
}

// claimKeys makes every region's API claim each key before it submits
// (apid.Config.ClaimKeys).
func claimKeys(c *cluster.Config) {
	onAPI(c, func(ac *apid.Config) { ac.ClaimKeys = true })
}

// ignoreKeyBody is scenario 1's bug: an idempotency key's fingerprint is
// not compared, so an answered key sent again with another body is
// replayed the first request's response instead of refused (422). A
// mismatch is resolved again as if the request had the stored
// fingerprint: what the store would answer without the comparison (a key
// in flight still gets its 409, one taken over or expired is claimed).
type ignoreKeyBody struct{ api.Store }

func (s ignoreKeyBody) ResolveKey(ctx context.Context, c api.KeyClaim) (api.IdempotencyKey, api.KeyOutcome, error) {
	return ignoringBody(ctx, c, s.Store.ResolveKey)
}

// LookupKey is the same bug on the unclaimed path: a repeat the ledger
// stream recognised is replayed the stored response whatever its body.
func (s ignoreKeyBody) LookupKey(ctx context.Context, c api.KeyClaim) (api.IdempotencyKey, api.KeyOutcome, error) {
	return ignoringBody(ctx, c, s.Store.LookupKey)
}

// ignoringBody asks resolve, and on a mismatch asks again with the stored
// fingerprint.
func ignoringBody(ctx context.Context, c api.KeyClaim,
	resolve func(context.Context, api.KeyClaim) (api.IdempotencyKey, api.KeyOutcome, error)) (api.IdempotencyKey, api.KeyOutcome, error) {
	k, out, err := resolve(ctx, c)
	if err == nil && out == api.KeyMismatch {
		c.Fingerprint = k.Fingerprint
		return resolve(ctx, c)
	}
	return k, out, err
}

// forgetKeyTransfer is scenario 10's bug: the lookup of the transfer a
// client's key made finds nothing, so a request repeated after its
// idempotency key expired is submitted again under a new transfer ID
// instead of answered with the transfer it made.
type forgetKeyTransfer struct{ api.Store }

func (s forgetKeyTransfer) StartKey(ctx context.Context, c api.KeyClaim, source string) (api.KeyStart, error) {
	st, err := s.Store.StartKey(ctx, c, source)
	st.Prior = ledger.Transfer{}
	return st, err
}

func (forgetKeyTransfer) TransferByKey(context.Context, string, string) (ledger.Transfer, bool, error) {
	return ledger.Transfer{}, false, nil
}

// skipOwnerCheck is scenario 11's bug (BOLA): the source account of a
// transfer is reported as the caller's customer account whoever owns it,
// so the API's owner check passes and any client can move another
// client's money. StartKey, which claims a key only for an own account,
// then leaves the key unclaimed, and the API claims it with ResolveKey.
type skipOwnerCheck struct{ api.Store }

func (s skipOwnerCheck) StartKey(ctx context.Context, c api.KeyClaim, source string) (api.KeyStart, error) {
	st, err := s.Store.StartKey(ctx, c, source)
	return ownedByCaller(c, st, err)
}

// CheckAccounts is the same lie on the unclaimed path's read.
func (s skipOwnerCheck) CheckAccounts(ctx context.Context, c api.KeyClaim, source string) (api.KeyStart, error) {
	st, err := s.Store.CheckAccounts(ctx, c, source)
	return ownedByCaller(c, st, err)
}

// trustCommandClient is the ledger's half of scenario 11's bug: the ledger
// takes a transfer's source as its client's, whoever owns it. It hands the
// store each transfer under the client that owns its source, so the
// ledger's own owner check passes and the other client's money moves.
type trustCommandClient struct{ store *postgres.Store }

func (t trustCommandClient) Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	var sources []string
	for _, c := range cmds {
		if c.Type == ledger.TypeTransfer {
			sources = append(sources, c.From)
		}
	}
	owner := map[string]string{}
	rows, err := t.store.Pool().Query(ctx, `SELECT id, client_id FROM accounts WHERE id = ANY($1)`, sources)
	if err != nil {
		return nil, err
	}
	var id, client string
	if _, err := pgx.ForEachRow(rows, []any{&id, &client}, func() error { owner[id] = client; return nil }); err != nil {
		return nil, err
	}
	as := slices.Clone(cmds)
	for i, c := range as {
		if o, ok := owner[c.From]; ok && c.Type == ledger.TypeTransfer {
			as[i].ClientID = o
		}
	}
	return t.store.Apply(ctx, as)
}

// ownedByCaller rewrites a found source account as the caller's customer
// account.
func ownedByCaller(c api.KeyClaim, st api.KeyStart, err error) (api.KeyStart, error) {
	if err == nil && st.SourceFound {
		st.Source.ClientID, st.Source.Kind = c.Client, ledger.KindCustomer
	}
	return st, err
}

// uncheckedForwards is scenario 16's bug: the API runs a forwarded call
// that its forward check refused (forwardcheck.go), as a receiver without
// the check would; only a call it cannot decode, or whose operation it
// does not serve, is still refused. A decorator of its ForwardReader
// (apid.Config.WrapForwardReader).
type uncheckedForwards struct{ api.ForwardReader }

// ReadForwarded lets every decoded call of a known operation through.
func (u uncheckedForwards) ReadForwarded(data []byte) (api.Call, api.Refusal, error) {
	c, why, err := u.ForwardReader.ReadForwarded(data)
	if err != nil && why != api.RefusedMalformed && why != api.RefusedOp {
		return c, why, nil
	}
	return c, why, err
}

// revocationBlind is scenario 17's bug: the API's store keeps every client
// it found by an API key and answers that key with it from then on, a
// cache that never refreshes, so a revoked key goes on authenticating.
type revocationBlind struct {
	api.Store
	seen *sync.Map // string(key hash) -> api.RegisteredClient
}

// ClientByKey answers a key the store no longer takes with the client it
// found by it before.
func (s revocationBlind) ClientByKey(ctx context.Context, hash []byte) (api.RegisteredClient, bool, error) {
	c, ok, err := s.Store.ClientByKey(ctx, hash)
	switch {
	case err != nil:
		return c, ok, err
	case ok:
		s.seen.Store(string(hash), c)
		return c, ok, nil
	}
	if v, found := s.seen.Load(string(hash)); found {
		return v.(api.RegisteredClient), true, nil
	}
	return c, false, nil
}
