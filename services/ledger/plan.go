package ledger

import (
	"slices"
	"strings"

	"github.com/paymesh/paymesh/pkg/idgen"
)

// Outcome is what one command does inside a batch. Exactly one of these
// happens: a new transfer is recorded (client request), an existing transfer
// moves on (confirm, refuse), or a credit is recorded (credit step). Every
// outcome may post to the change-log and queue the next saga step.
type Outcome struct {
	// Transfer is the new or updated transfer; zero for a credit.
	Transfer Transfer
	// FromStatus and FromVersion guard the update of an existing transfer
	// (compare-and-set); FromStatus is empty for a new transfer.
	FromStatus  Status
	FromVersion int64
	// Credit is the credit recorded by a credit step.
	Credit   *Credit
	Postings []Posting
	Outbox   []OutboxMessage
	// Err is the reason a command was refused.
	Err *Error
	// Result classifies the outcome for the caller (Applied, Rejected,
	// Duplicate by state, Parked, Invalid or AwaitingAccount).
	Result ResultKind
}

// Rejected reports whether the command was refused.
func (o Outcome) Rejected() bool { return o.Result == Rejected }

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

// Batch is the state a batch is planned against: the locked rows of one
// region's ledger.
type Batch struct {
	// Home is the region of this ledger.
	Home    string
	Regions *idgen.Regions
	// Accounts holds every account the commands name that exists here, with
	// the region's issuance and transit accounts.
	Accounts map[string]Account
	// Transfers holds the transfers that confirm and refuse steps name.
	Transfers map[string]Transfer
	// Issuance and Transit map a currency to this region's issuance and
	// transit account IDs.
	Issuance, Transit map[string]string
}

// Plan applies cmds in order and returns the writes; the Batch is not
// modified. Each command sees the balances left by the commands before it,
// so floor checks stay exact when one batch debits an account several
// times. A command that cannot apply is refused with a reason and changes
// nothing. cmds must be valid for this region (Command.Validate).
func (b Batch) Plan(cmds []Command) Plan {
	w := &work{Batch: b, acc: make(map[string]*Account, len(b.Accounts)), xfer: make(map[string]*Transfer, len(b.Transfers))}
	for id, a := range b.Accounts {
		w.acc[id] = &a
	}
	for id, t := range b.Transfers {
		w.xfer[id] = &t
	}
	p := Plan{Outcomes: make([]Outcome, len(cmds))}
	for i, c := range cmds {
		switch c.Type {
		case TypeTransfer, TypeFund:
			p.Outcomes[i] = w.request(c)
		case TypeCredit:
			p.Outcomes[i] = w.credit(c)
		case TypeConfirm, TypeRefuse:
			p.Outcomes[i] = w.settle(c)
		}
	}
	for id, a := range w.acc {
		orig := b.Accounts[id]
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

// PlanBatch plans same-region requests against accounts: a shorthand for a
// Batch without saga state.
func PlanBatch(accounts map[string]Account, cmds []Command) Plan {
	return Batch{Accounts: accounts}.Plan(cmds)
}

type work struct {
	Batch
	acc  map[string]*Account
	xfer map[string]*Transfer
}

func (w *work) cross(c Command) bool {
	if w.Regions == nil || c.Type == TypeFund {
		return false
	}
	to, err := w.Regions.HomeRegion(c.To)
	return err == nil && to != w.Home
}

// post moves amount from one account to another and returns the two
// change-log rows.
func post(transferID string, from *Account, fromLeg Leg, to *Account, toLeg Leg, amount int64) []Posting {
	from.Balance -= amount
	from.Version++
	to.Balance += amount
	to.Version++
	return []Posting{
		{TransferID: transferID, Leg: fromLeg, AccountID: from.ID, Amount: -amount, BalanceAfter: from.Balance, AccountVersion: from.Version},
		{TransferID: transferID, Leg: toLeg, AccountID: to.ID, Amount: amount, BalanceAfter: to.Balance, AccountVersion: to.Version},
	}
}

// request records a client's transfer or fund: completed in one step within
// a region, or debited into transit with a credit step queued for the
// destination region.
func (w *work) request(c Command) Outcome {
	t := Transfer{
		ID: c.TransferID, ClientID: c.ClientID, IdempotencyKey: c.IdempotencyKey,
		Fingerprint: c.Fingerprint(), From: c.From, To: c.To, Amount: c.Amount,
		Currency: c.Currency, Status: StatusPending, CreatedAt: c.CreatedAt, Version: 1,
	}
	if c.Type == TypeFund {
		t.From = w.Issuance[c.Currency]
	}
	reject := func(err *Error) Outcome {
		if err.Code == CodeAccountNotFound {
			// Not a refusal: the account may be created later, and a
			// replay of the dead letter must then apply the request.
			return Outcome{Err: err, Result: AwaitingAccount}
		}
		t.Status, _ = Next(StatusPending, EventReject)
		t.Reason = err.Code
		return Outcome{Transfer: t, Err: err, Result: Rejected}
	}
	from := w.acc[t.From]
	if !w.cross(c) {
		to, err := w.check(c, from, w.acc[c.To])
		if err != nil {
			return reject(err)
		}
		t.Status, _ = Next(StatusPending, EventComplete)
		return Outcome{Transfer: t, Postings: post(t.ID, from, LegDebit, to, LegCredit, c.Amount), Result: Applied}
	}
	transit := w.acc[w.Transit[c.Currency]]
	if transit == nil {
		return reject(Errorf(CodeAccountNotFound, "no transit account for %s in this region", c.Currency))
	}
	if _, err := w.check(c, from, transit); err != nil {
		return reject(err)
	}
	dest, _ := w.Regions.HomeRegion(c.To)
	t.Status, _ = Next(StatusPending, EventDebit)
	return Outcome{Transfer: t, Postings: post(t.ID, from, LegDebit, transit, LegHold, c.Amount), Result: Applied,
		Outbox: []OutboxMessage{{Region: dest, Account: c.To, Command: c.Step(TypeCredit, "")}}}
}

// credit applies the credit step in the destination region, or refuses it;
// either way a step goes back to the source region.
func (w *work) credit(c Command) Outcome {
	source, _ := w.Regions.HomeRegion(c.TransferID)
	cr := &Credit{TransferID: c.TransferID, From: c.From, To: c.To, Amount: c.Amount, Currency: c.Currency, CreatedAt: c.CreatedAt}
	transit := w.acc[w.Transit[c.Currency]]
	to := w.acc[c.To]
	err := w.checkCredit(c, transit, to)
	if err != nil {
		cr.Status, cr.Reason = CreditRefused, err.Code
		return Outcome{Credit: cr, Err: err, Result: Applied,
			Outbox: []OutboxMessage{{Region: source, Account: c.From, Command: c.Step(TypeRefuse, err.Code)}}}
	}
	cr.Status = CreditApplied
	return Outcome{Credit: cr, Postings: post(c.TransferID, transit, LegRelease, to, LegCredit, c.Amount), Result: Applied,
		Outbox: []OutboxMessage{{Region: source, Account: c.From, Command: c.Step(TypeConfirm, "")}}}
}

func (w *work) checkCredit(c Command, transit, to *Account) *Error {
	switch {
	case transit == nil:
		return Errorf(CodeAccountNotFound, "no transit account for %s in this region", c.Currency)
	case to == nil || to.Kind != KindCustomer:
		return Errorf(CodeAccountNotFound, "destination account %s does not exist", c.To)
	case to.Closed:
		return Errorf(CodeAccountClosed, "destination account %s is closed", c.To)
	case to.Currency != c.Currency:
		return Errorf(CodeCurrencyMismatch, "destination account %s holds %s, not %s", c.To, to.Currency, c.Currency)
	case to.Balance > maxInt64-c.Amount:
		return Errorf(CodeBalanceOverflow, "credit of %d would overflow account %s", c.Amount, c.To)
	case transit.Balance < minInt64+c.Amount:
		return Errorf(CodeBalanceOverflow, "credit of %d would overflow the transit account", c.Amount)
	}
	return nil
}

// settle applies a confirm or refuse step to the debited transfer in the
// source region, with a compare-and-set on its status and version. A step
// for a transfer this ledger does not know yet is parked; a step the
// transfer has already taken is a duplicate caught by the state machine.
func (w *work) settle(c Command) Outcome {
	t := w.xfer[c.TransferID]
	if t == nil {
		return Outcome{Result: Parked, Err: Errorf(CodeNotFound, "transfer %s is not here yet", c.TransferID)}
	}
	ev, done := EventConfirm, StatusCompleted
	if c.Type == TypeRefuse {
		ev, done = EventRefund, StatusRefunded
	}
	next, err := Next(t.Status, ev)
	if err != nil {
		if t.Status == done {
			return Outcome{Transfer: *t, Result: Duplicate}
		}
		return Outcome{Transfer: *t, Result: Invalid, Err: err.(*Error)}
	}
	o := Outcome{FromStatus: t.Status, FromVersion: t.Version, Result: Applied}
	if c.Type == TypeRefuse {
		from, transit := w.acc[t.From], w.acc[w.Transit[t.Currency]]
		if from == nil || transit == nil || from.Balance > maxInt64-t.Amount {
			return Outcome{Transfer: *t, Result: Invalid, Err: Errorf(CodeBalanceOverflow, "refund of %d to %s cannot be posted", t.Amount, t.From)}
		}
		o.Postings = post(t.ID, transit, LegUnhold, from, LegRefund, t.Amount)
		t.Reason = c.Reason
	}
	t.Status, t.Version = next, t.Version+1
	o.Transfer = *t
	return o
}

// check returns the two accounts of a same-region move, or the reason the
// command cannot apply to the current balances.
func (w *work) check(c Command, from, to *Account) (*Account, *Error) {
	switch {
	case from == nil && c.Type == TypeFund:
		return nil, Errorf(CodeAccountNotFound, "no issuance account for %s in this region", c.Currency)
	case from == nil:
		return nil, Errorf(CodeAccountNotFound, "source account %s does not exist", c.From)
	case to == nil:
		return nil, Errorf(CodeAccountNotFound, "destination account %s does not exist", c.To)
	case from.Closed:
		return nil, Errorf(CodeAccountClosed, "source account %s is closed", from.ID)
	case to.Closed:
		return nil, Errorf(CodeAccountClosed, "destination account %s is closed", to.ID)
	case from.Currency != c.Currency:
		return nil, Errorf(CodeCurrencyMismatch, "source account %s holds %s, not %s", from.ID, from.Currency, c.Currency)
	case to.Currency != c.Currency:
		return nil, Errorf(CodeCurrencyMismatch, "destination account %s holds %s, not %s", to.ID, to.Currency, c.Currency)
	case from.ID == to.ID:
		return nil, Errorf(CodeSameAccount, "source and destination are both %s", from.ID)
	case to.Kind == KindIssuance:
		return nil, Errorf(CodeInvalidRequest, "money can only be moved into a customer account")
	case c.Type == TypeTransfer && from.Kind != KindCustomer:
		return nil, Errorf(CodeInvalidRequest, "transfers move money between customer accounts only")
	}
	// Balance >= Floor always holds, so Balance - Floor >= 0; it can only
	// overflow when the floor is far negative, and then funds are ample.
	if room := from.Balance - from.Floor; room >= 0 && room < c.Amount {
		return nil, Errorf(CodeInsufficientFunds, "source account %s has %d available, needs %d", from.ID, room, c.Amount)
	}
	if from.Balance < minInt64+c.Amount {
		return nil, Errorf(CodeBalanceOverflow, "debit of %d would overflow account %s", c.Amount, from.ID)
	}
	if to.Balance > maxInt64-c.Amount {
		return nil, Errorf(CodeBalanceOverflow, "credit of %d would overflow account %s", c.Amount, to.ID)
	}
	return to, nil
}

const (
	maxInt64 = 1<<63 - 1
	minInt64 = -1 << 63
)
