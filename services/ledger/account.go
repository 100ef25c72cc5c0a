package ledger

import (
	"math"
	"time"
)

// Kind separates customer accounts from the issuance account of a currency.
type Kind string

// Account kinds.
const (
	// KindCustomer is an ordinary account owned by a client.
	KindCustomer Kind = "customer"
	// KindIssuance is the one account per region and currency that funding
	// is drawn from. Its balance is minus the money issued, so the sum of all
	// balances in a currency is always zero and money is never created
	// silently.
	KindIssuance Kind = "issuance"
	// KindTransit is the one account per region and currency that holds
	// money between the debit in the source region and the credit in the
	// destination region. Across all regions the transit balances sum to
	// the money in transit.
	KindTransit Kind = "transit"
)

// NoFloor is the floor of an account that may go arbitrarily negative.
const NoFloor = math.MinInt64

// Account holds a balance in one currency.
type Account struct {
	ID       string
	ClientID string
	Kind     Kind
	Currency string
	Balance  int64
	// Held is the money reserved by the account's open holds: a debit may
	// only use Available above the floor.
	Held int64
	// Floor is the lowest balance allowed: 0 for no overdraft, negative for
	// an overdraft limit, NoFloor for the issuance account.
	Floor  int64
	Closed bool
	// Frozen stops the account's debits; credits still land.
	Frozen bool
	// Version counts the postings applied to the account.
	Version   int64
	CreatedAt time.Time
	// Reference and Metadata are the client's, from the request that
	// opened the account. The reads of an account fill them in; the apply
	// does not read them.
	Reference string
	Metadata  map[string]string
}

// Available is what a new debit may use: the balance less what open holds
// reserve.
func (a Account) Available() int64 { return a.Balance - a.Held }

// NewAccount is a request to open an account.
type NewAccount struct {
	ClientID string
	Currency string
	// Floor is the lowest balance allowed; 0 forbids overdraft. It must not
	// be positive.
	Floor int64
	// IdempotencyKey, when set, makes the request safe to retry: the
	// client's key opens at most one account, and RequestHash (the
	// fingerprint of the request that asked for it) tells a retry of that
	// request from another request under the same key.
	IdempotencyKey string
	RequestHash    []byte
	// Reference, when set, is unique among the client's accounts in the
	// region; Metadata is kept with the account.
	Reference string
	Metadata  map[string]string
}

// Validate returns an *Error describing the first problem with the request.
func (n NewAccount) Validate() error {
	switch {
	case n.ClientID == "" || len(n.ClientID) > 64:
		return Errorf(CodeInvalidRequest, "client_id must be 1-64 characters")
	case !ValidCurrency(n.Currency):
		return Errorf(CodeInvalidCurrency, "currency %q is not an ISO 4217 currency code", n.Currency)
	case n.Floor > 0:
		return Errorf(CodeInvalidRequest, "floor %d must not be positive", n.Floor)
	case n.IdempotencyKey == "" && len(n.RequestHash) > 0:
		return Errorf(CodeInvalidRequest, "a request fingerprint without an idempotency key")
	case n.IdempotencyKey != "" && len(n.RequestHash) == 0:
		return Errorf(CodeInvalidRequest, "idempotency key %.64q without the request's fingerprint", n.IdempotencyKey)
	case n.IdempotencyKey != "":
		if err := ValidIdempotencyKey(n.IdempotencyKey); err != nil {
			return err
		}
	}
	return ValidLabels(n.Reference, n.Metadata)
}
