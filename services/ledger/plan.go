package ledger

import (
	"slices"
	"strings"
)

// Outcome is what one command does inside a batch: a transfer that
// completed, or one that was rejected with a reason (no postings).
type Outcome struct {
	Transfer Transfer
	Postings []Posting
	// Err is the reason a rejected command was refused.
	Err *Error
}

// Rejected reports whether the command was refused.
func (o Outcome) Rejected() bool { return o.Transfer.Status == StatusRejected }

// AccountChange is the net effect of a batch on one account: its balance and
// version before (the compare-and-set guard) and after.
type AccountChange struct {
	ID                     string
	FromVersion, ToVersion int64
	FromBalance, ToBalance int64
}

// Plan is the set of writes a batch makes.
type Plan struct {
	Outcomes []Outcome
	Accounts []AccountChange // sorted by ID
}

// PlanBatch applies cmds in order to the given account states and returns
// the writes. accounts holds every account the commands name that exists
// (with fund commands already pointing From at the issuance account); it is
// not modified. Each command sees the balances left by the commands before
// it, so floor checks stay exact when one batch debits an account several
// times. A command that cannot apply is rejected with a reason and changes
// nothing. cmds must already be valid (Command.Validate).
func PlanBatch(accounts map[string]Account, cmds []Command) Plan {
	work := make(map[string]*Account, len(accounts))
	for id, a := range accounts {
		a := a
		work[id] = &a
	}
	p := Plan{Outcomes: make([]Outcome, len(cmds))}
	for i, c := range cmds {
		p.Outcomes[i] = applyOne(work, c)
	}
	for id, a := range work {
		orig := accounts[id]
		if a.Version != orig.Version {
			p.Accounts = append(p.Accounts, AccountChange{
				ID: id, FromVersion: orig.Version, ToVersion: a.Version,
				FromBalance: orig.Balance, ToBalance: a.Balance,
			})
		}
	}
	slices.SortFunc(p.Accounts, func(a, b AccountChange) int { return strings.Compare(a.ID, b.ID) })
	return p
}

func applyOne(work map[string]*Account, c Command) Outcome {
	t := Transfer{
		ID: c.TransferID, ClientID: c.ClientID, IdempotencyKey: c.IdempotencyKey,
		Fingerprint: c.Fingerprint(), From: c.From, To: c.To, Amount: c.Amount,
		Currency: c.Currency, Status: StatusPending, CreatedAt: c.CreatedAt,
	}
	from, to, err := check(work, c)
	if err != nil {
		t.Status, _ = Next(StatusPending, EventReject)
		t.Reason, t.Version = err.Code, 1
		return Outcome{Transfer: t, Err: err}
	}
	t.Status, _ = Next(StatusPending, EventComplete)
	t.Version = 1
	from.Balance -= c.Amount
	from.Version++
	to.Balance += c.Amount
	to.Version++
	return Outcome{Transfer: t, Postings: []Posting{
		{TransferID: t.ID, Leg: LegDebit, AccountID: from.ID, Amount: -c.Amount, BalanceAfter: from.Balance, AccountVersion: from.Version},
		{TransferID: t.ID, Leg: LegCredit, AccountID: to.ID, Amount: c.Amount, BalanceAfter: to.Balance, AccountVersion: to.Version},
	}}
}

// check returns the two accounts, or the reason the command cannot apply to
// the current balances.
func check(work map[string]*Account, c Command) (from, to *Account, err *Error) {
	from, to = work[c.From], work[c.To]
	switch {
	case from == nil && c.Type == TypeFund:
		return nil, nil, Errorf(CodeAccountNotFound, "no issuance account for %s in this region", c.Currency)
	case from == nil:
		return nil, nil, Errorf(CodeAccountNotFound, "source account %s does not exist", c.From)
	case to == nil:
		return nil, nil, Errorf(CodeAccountNotFound, "destination account %s does not exist", c.To)
	case from.Closed:
		return nil, nil, Errorf(CodeAccountClosed, "source account %s is closed", from.ID)
	case to.Closed:
		return nil, nil, Errorf(CodeAccountClosed, "destination account %s is closed", to.ID)
	case from.Currency != c.Currency:
		return nil, nil, Errorf(CodeCurrencyMismatch, "source account %s holds %s, not %s", from.ID, from.Currency, c.Currency)
	case to.Currency != c.Currency:
		return nil, nil, Errorf(CodeCurrencyMismatch, "destination account %s holds %s, not %s", to.ID, to.Currency, c.Currency)
	case from.ID == to.ID:
		return nil, nil, Errorf(CodeSameAccount, "source and destination are both %s", from.ID)
	case to.Kind != KindCustomer:
		return nil, nil, Errorf(CodeInvalidRequest, "money can only be moved into a customer account")
	case c.Type == TypeTransfer && from.Kind != KindCustomer:
		return nil, nil, Errorf(CodeInvalidRequest, "transfers move money between customer accounts only")
	}
	// Balance >= Floor always holds, so Balance - Floor >= 0; it can only
	// overflow when the floor is far negative, and then funds are ample.
	if room := from.Balance - from.Floor; room >= 0 && room < c.Amount {
		return nil, nil, Errorf(CodeInsufficientFunds, "source account %s has %d available, needs %d", from.ID, room, c.Amount)
	}
	if from.Balance < minInt64+c.Amount {
		return nil, nil, Errorf(CodeBalanceOverflow, "debit of %d would overflow account %s", c.Amount, from.ID)
	}
	if to.Balance > maxInt64-c.Amount {
		return nil, nil, Errorf(CodeBalanceOverflow, "credit of %d would overflow account %s", c.Amount, to.ID)
	}
	return from, to, nil
}

const (
	maxInt64 = 1<<63 - 1
	minInt64 = -1 << 63
)
