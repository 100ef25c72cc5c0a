package ledger

import (
	"maps"
	"slices"
	"strings"
	"time"

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
	Credit *Credit
	// Action is the record of a capture or void, or of an account action,
	// applied or refused.
	Action *Action
	// Account is the account an account action applied to, as it is after
	// it: its closed and frozen flags are written.
	Account  *Account
	Postings []Posting
	Outbox   []OutboxMessage
	// CancelTimer names the hold whose expiry step is no longer due: it
	// was captured or voided.
	CancelTimer string
	// Err is the reason a command was refused.
	Err *Error
	// Result classifies the outcome for the caller (Applied, Rejected,
	// Duplicate by state, Parked, Invalid or AwaitingAccount).
	Result ResultKind
}

// Rejected reports whether the command was refused.
func (o Outcome) Rejected() bool { return o.Result == Rejected }

// AccountChange is the net effect of a batch on one account: its balance,
// held amount and version before (the compare-and-set guard) and after.
type AccountChange struct {
	ID                     string
	FromVersion, ToVersion int64
	FromBalance, ToBalance int64
	FromHeld, ToHeld       int64
}

// RefundedChange is the net effect of a batch's refunds on the refunded
// amount of the transfer they refund: its transfer row here (Credit false)
// or its credit row (Credit true, a transfer from another region).
type RefundedChange struct {
	ID       string
	Credit   bool
	From, To int64
}

// Plan is the set of writes a batch makes.
type Plan struct {
	Outcomes []Outcome
	Accounts []AccountChange  // sorted by ID
	Refunded []RefundedChange // sorted by ID
}

// ActionStatus is the outcome of a capture or void.
type ActionStatus string

// Action statuses.
const (
	ActionApplied  ActionStatus = "APPLIED"
	ActionRejected ActionStatus = "REJECTED"
)

// Action is the record of one capture or void request, or of one account
// action, unique per client and idempotency key (its business key): which
// hold (TransferID) or account (AccountID), what it captured, and whether
// it won or why it was refused.
type Action struct {
	ClientID       string
	IdempotencyKey string
	Fingerprint    []byte
	TransferID     string
	AccountID      string
	Type           string
	Amount         int64
	Status         ActionStatus
	Reason         Code
	CreatedAt      time.Time
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
	// Transfers holds the transfers that saga steps, captures and voids
	// name, and the transfers here that refunds name.
	Transfers map[string]Transfer
	// Credits holds the credits recorded here of the transfers that
	// refunds name in another region, and of the refunds that refuse steps
	// name.
	Credits map[string]Credit
	// Now is when the batch is decided: a hold expires from its ExpiresAt.
	Now time.Time
	// InFlight counts, for each account a close names, its transfers
	// debited on their way to another region (DEBITED): their refusal
	// would credit it back.
	InFlight map[string]int
	// References maps a client's reference (ReferenceKey) to the transfer
	// recorded here that holds it, for the references the requests give.
	References map[string]string
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
	w := &work{Batch: b, acc: make(map[string]*Account, len(b.Accounts)), xfer: make(map[string]*Transfer, len(b.Transfers)),
		credits: make(map[string]*Credit, len(b.Credits)), refs: maps.Clone(b.References)}
	for id, a := range b.Accounts {
		w.acc[id] = &a
	}
	for id, t := range b.Transfers {
		w.xfer[id] = &t
	}
	for id, cr := range b.Credits {
		w.credits[id] = &cr
	}
	p := Plan{Outcomes: make([]Outcome, len(cmds))}
	for i, c := range cmds {
		switch c.Type {
		case TypeTransfer, TypeFund, TypeRefund:
			p.Outcomes[i] = w.request(c)
		case TypeCapture, TypeVoid:
			p.Outcomes[i] = w.act(c)
		case TypeExpire:
			p.Outcomes[i] = w.expire(c)
		case TypeCredit:
			p.Outcomes[i] = w.credit(c)
		case TypeConfirm, TypeRefuse:
			p.Outcomes[i] = w.settle(c)
		case TypeClose, TypeFreeze, TypeUnfreeze:
			p.Outcomes[i] = w.change(c)
		}
	}
	for id, a := range w.acc {
		orig := b.Accounts[id]
		if a.Version != orig.Version || a.Held != orig.Held {
			p.Accounts = append(p.Accounts, AccountChange{
				ID: id, FromVersion: orig.Version, ToVersion: a.Version,
				FromBalance: orig.Balance, ToBalance: a.Balance, FromHeld: orig.Held, ToHeld: a.Held,
			})
		}
	}
	slices.SortFunc(p.Accounts, func(a, b AccountChange) int { return strings.Compare(a.ID, b.ID) })
	for id, t := range w.xfer {
		if orig := b.Transfers[id]; t.RefundedAmount != orig.RefundedAmount {
			p.Refunded = append(p.Refunded, RefundedChange{ID: id, From: orig.RefundedAmount, To: t.RefundedAmount})
		}
	}
	for id, cr := range w.credits {
		if orig := b.Credits[id]; cr.RefundedAmount != orig.RefundedAmount {
			p.Refunded = append(p.Refunded, RefundedChange{ID: id, Credit: true, From: orig.RefundedAmount, To: cr.RefundedAmount})
		}
	}
	slices.SortFunc(p.Refunded, func(a, b RefundedChange) int { return strings.Compare(a.ID, b.ID) })
	return p
}

// PlanBatch plans same-region requests against accounts: a shorthand for a
// Batch without saga state.
func PlanBatch(accounts map[string]Account, cmds []Command) Plan {
	return Batch{Accounts: accounts}.Plan(cmds)
}

type work struct {
	Batch
	acc     map[string]*Account
	xfer    map[string]*Transfer
	credits map[string]*Credit
	// refs holds the references taken, those of the batch's transfers
	// recorded so far with them.
	refs map[string]string
}

// ReferenceKey is the key of Batch.References: a client's reference.
func ReferenceKey(client, reference string) string { return client + "\x00" + reference }

func (w *work) cross(c Command) bool {
	if w.Regions == nil || c.Type == TypeFund {
		return false
	}
	to, err := w.Regions.HomeRegion(c.To)
	return err == nil && to != w.Home
}

// here reports whether the transfer id was made in this region.
func (w *work) here(id string) bool {
	if w.Regions == nil {
		return true
	}
	r, err := w.Regions.HomeRegion(id)
	return err == nil && r == w.Home
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

// request records a client's transfer, fund or refund: completed in one
// step within a region, or debited into transit with a credit step queued
// for the destination region. A hold only reserves the amount on the
// source, and queues its expiry step, due at its expiry.
func (w *work) request(c Command) Outcome {
	t := Transfer{
		ID: c.TransferID, ClientID: c.ClientID, IdempotencyKey: c.IdempotencyKey,
		Fingerprint: c.Fingerprint(), From: c.From, To: c.To, Amount: c.Amount,
		Currency: c.Currency, Status: StatusPending, CreatedAt: c.CreatedAt, Version: 1, RefundOf: c.RefundOf,
		Reference: c.Reference, Metadata: c.Metadata,
	}
	if c.Hold {
		t.ExpiresAt = c.ExpiresAt
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
	if from := w.acc[t.From]; c.Type == TypeTransfer && from != nil && from.Kind == KindCustomer && from.ClientID != c.ClientID {
		// The API sends only its client's own accounts: a command naming
		// another's was forged or corrupted on its way. Nothing is recorded
		// (the key stays free), and an operator sees it dead-lettered.
		return Outcome{Result: Invalid, Err: Errorf(CodeAccountNotFound, "source account %s is not an account of client %s", t.From, c.ClientID)}
	}
	var refunded *int64 // the refunded transfer's refunded amount (its row here, or its credit's)
	if c.Type == TypeRefund {
		if from := w.acc[c.From]; from != nil && from.ClientID != c.ClientID {
			// Only the payee's owner refunds; anyone else learns nothing.
			return reject(Errorf(CodeNotFound, "transfer %s does not exist", c.RefundOf))
		}
		n, sum, err := w.refundable(c)
		if err != nil {
			return reject(err)
		}
		c.Amount, t.Amount, refunded = n, n, sum
	}
	from := w.acc[t.From]
	var to *Account
	switch {
	case w.cross(c) && c.Hold:
		// A hold moves nothing yet: its capture takes the transit account
		// (not locked for a hold, so that holds do not queue on it).
		to = &Account{ID: w.Transit[c.Currency], Kind: KindTransit, Currency: c.Currency}
	case w.cross(c):
		to = w.acc[w.Transit[c.Currency]]
		if to == nil {
			return reject(Errorf(CodeAccountNotFound, "no transit account for %s in this region", c.Currency))
		}
	default:
		to = w.acc[c.To]
	}
	if _, err := w.check(c, from, to); err != nil {
		return reject(err)
	}
	if err := w.takeReference(c); err != nil {
		return reject(err)
	}
	if c.Hold {
		t.Status, _ = Next(StatusPending, EventHold)
		from.Held += c.Amount
		return Outcome{Transfer: t, Result: Applied,
			Outbox: []OutboxMessage{{Region: w.Home, Account: t.From, Command: StepOf(t, TypeExpire, t.Amount, ""), DueAt: t.ExpiresAt}}}
	}
	if refunded != nil {
		*refunded += c.Amount
	}
	if !w.cross(c) {
		t.Status, _ = Next(StatusPending, EventComplete)
		return Outcome{Transfer: t, Postings: post(t.ID, from, LegDebit, to, LegCredit, c.Amount), Result: Applied}
	}
	dest, _ := w.Regions.HomeRegion(c.To)
	t.Status, _ = Next(StatusPending, EventDebit)
	return Outcome{Transfer: t, Postings: post(t.ID, from, LegDebit, to, LegHold, c.Amount), Result: Applied,
		Outbox: []OutboxMessage{{Region: dest, Account: c.To, Command: c.Step(TypeCredit, "")}}}
}

// takeReference refuses a request whose reference another transfer of the
// client holds here, naming that transfer; a reference held by a transfer
// refused is free again. It takes the reference for c's transfer: it is
// the last check of a request, so nothing refuses c after it.
func (w *work) takeReference(c Command) *Error {
	if c.Reference == "" {
		return nil
	}
	k := ReferenceKey(c.ClientID, c.Reference)
	if holder, ok := w.refs[k]; ok && holder != c.TransferID {
		err := Errorf(CodeReferenceInUse, "reference %s is transfer %s's", quoteShort(c.Reference), holder)
		err.Existing = holder
		return err
	}
	if w.refs == nil {
		w.refs = map[string]string{}
	}
	w.refs[k] = c.TransferID
	return nil
}

// refundable resolves a refund against the transfer it refunds: that
// transfer must have completed, and the refunds decided here (this region
// is its payee's, which decides every refund of it) may not exceed what it
// moved. It returns the refund's amount (all that is left when c names
// none) and the refunded amount to add it to once the refund applies.
func (w *work) refundable(c Command) (int64, *int64, *Error) {
	var (
		moved      int64
		sum        *int64
		payer, cur string
		payee      string
	)
	if w.here(c.RefundOf) {
		p := w.xfer[c.RefundOf]
		switch {
		case p == nil:
			return 0, nil, Errorf(CodeNotFound, "transfer %s does not exist", c.RefundOf)
		case p.Status != StatusCompleted || p.RefundOf != "":
			return 0, nil, Errorf(CodeTransferNotRefundable, "transfer %s is %s: only a completed transfer can be refunded", p.ID, p.Status)
		}
		moved, sum, payer, payee, cur = p.Moved(), &p.RefundedAmount, p.From, p.To, p.Currency
	} else {
		cr := w.credits[c.RefundOf]
		switch {
		case cr == nil:
			// Its credit has not reached the payee's region (yet).
			return 0, nil, Errorf(CodeTransferNotRefundable, "transfer %s has not been credited to %s", c.RefundOf, c.From)
		case cr.Status != CreditApplied || cr.RefundOf != "":
			return 0, nil, Errorf(CodeTransferNotRefundable, "transfer %s was not credited: it cannot be refunded", c.RefundOf)
		}
		moved, sum, payer, payee, cur = cr.Amount, &cr.RefundedAmount, cr.From, cr.To, cr.Currency
	}
	if payee != c.From || payer != c.To || cur != c.Currency {
		return 0, nil, Errorf(CodeInvalidRequest, "a refund of %s goes from %s to %s in %s", c.RefundOf, payee, payer, cur)
	}
	left := moved - *sum
	n := c.Amount
	if n == 0 {
		n = left
	}
	switch {
	case n == 0:
		return 0, nil, Errorf(CodeRefundExceedsCaptured, "transfer %s moved %d, all of it refunded: nothing is left to refund", c.RefundOf, moved)
	case n > left:
		return 0, nil, Errorf(CodeRefundExceedsCaptured, "transfer %s moved %d, of which %d is refunded: a refund of %d exceeds it", c.RefundOf, moved, *sum, n)
	}
	return n, sum, nil
}

// act applies a capture or a void to an open hold, with a compare-and-set on
// its status and version: of the captures, voids and the expiry of one
// hold, exactly one applies. Whatever else is refused with a stable reason
// and recorded as such. A capture releases the whole hold and moves the
// captured amount, as a transfer would: within the region, or into transit
// with a credit step for the destination region.
func (w *work) act(c Command) Outcome {
	a := &Action{ClientID: c.ClientID, IdempotencyKey: c.IdempotencyKey, Fingerprint: c.Fingerprint(), TransferID: c.TransferID,
		Type: c.Type, Amount: c.Amount, Status: ActionApplied, CreatedAt: c.CreatedAt}
	refuse := func(err *Error) Outcome {
		a.Status, a.Reason = ActionRejected, err.Code
		return Outcome{Action: a, Err: err, Result: Rejected}
	}
	t := w.xfer[c.TransferID]
	switch {
	case t == nil || t.ClientID != c.ClientID:
		return refuse(Errorf(CodeNotFound, "transfer %s does not exist", c.TransferID))
	case t.From != c.From || t.To != c.To || t.Currency != c.Currency:
		return refuse(Errorf(CodeInvalidRequest, "transfer %s moves %s from %s to %s", t.ID, t.Currency, t.From, t.To))
	case t.Status != StatusHeld:
		return refuse(Errorf(CodeTransferNotHeld, "transfer %s is %s, not HELD", t.ID, t.Status))
	case c.Type == TypeCapture && !w.Now.Before(t.ExpiresAt):
		return refuse(Errorf(CodeHoldExpired, "hold %s expired at %s", t.ID, t.ExpiresAt.UTC().Format(time.RFC3339)))
	case c.Type == TypeCapture && c.Amount > t.Amount:
		return refuse(Errorf(CodeAmountExceedsHold, "hold %s holds %d, less than %d", t.ID, t.Amount, c.Amount))
	}
	from := w.acc[t.From]
	o := Outcome{FromStatus: t.Status, FromVersion: t.Version, Action: a, CancelTimer: t.ID, Result: Applied}
	if c.Type == TypeVoid {
		from.Held -= t.Amount
		t.Status, _ = Next(t.Status, EventVoid)
		t.Version++
		o.Transfer = *t
		return o
	}
	n := c.Amount
	if n == 0 {
		n = t.Amount
	}
	move := Command{Type: TypeTransfer, From: t.From, To: t.To, Amount: n, Currency: t.Currency}
	cross := w.cross(move)
	var to *Account
	if cross {
		to = w.acc[w.Transit[t.Currency]]
	} else {
		to = w.acc[t.To]
	}
	from.Held -= t.Amount // the capture releases the whole hold, then moves n
	if _, err := w.check(move, from, to); err != nil {
		from.Held += t.Amount
		return refuse(err)
	}
	a.Amount, t.CapturedAmount = n, n
	t.Version++
	if !cross {
		t.Status, _ = Next(StatusHeld, EventCapture)
		o.Postings = post(t.ID, from, LegDebit, to, LegCredit, n)
		o.Transfer = *t
		return o
	}
	dest, _ := w.Regions.HomeRegion(t.To)
	t.Status, _ = Next(StatusHeld, EventCaptureDebit)
	o.Postings = post(t.ID, from, LegDebit, to, LegHold, n)
	step := StepOf(*t, TypeCredit, n, c.Trace)
	step.CreatedAt = c.CreatedAt // the saga's stages count from the capture, not the authorization
	o.Outbox = []OutboxMessage{{Region: dest, Account: t.To, Command: step}}
	o.Transfer = *t
	return o
}

// expire applies a hold's expiry step: an open hold past its expiry is
// released (EXPIRED). A hold captured or voided first has nothing left to
// expire: the step is a duplicate, caught by the state machine. A step
// early by the clocks is parked, to come again.
func (w *work) expire(c Command) Outcome {
	t := w.xfer[c.TransferID]
	switch {
	case t == nil:
		return Outcome{Result: Invalid, Err: Errorf(CodeNotFound, "hold %s does not exist", c.TransferID)}
	case t.Status != StatusHeld:
		return Outcome{Transfer: *t, Result: Duplicate}
	case w.Now.Before(t.ExpiresAt):
		return Outcome{Result: Parked, Err: Errorf(CodeHoldExpired, "hold %s expires at %s, not yet", t.ID, t.ExpiresAt.UTC().Format(time.RFC3339))}
	}
	o := Outcome{FromStatus: t.Status, FromVersion: t.Version, Result: Applied}
	w.acc[t.From].Held -= t.Amount
	t.Status, _ = Next(t.Status, EventExpire)
	t.Version++
	o.Transfer = *t
	return o
}

// change applies a close, freeze or unfreeze to the client's account, or
// refuses it with the reason: a close needs a zero balance, no open hold
// and no transfer on its way out (whose refusal would credit it back); a
// freeze needs an account not frozen, an unfreeze a frozen one; a closed
// account changes no more. The account's row is locked, so a debit of it
// waits for (or is planned before) the change.
func (w *work) change(c Command) Outcome {
	a := &Action{ClientID: c.ClientID, IdempotencyKey: c.IdempotencyKey, Fingerprint: c.Fingerprint(), AccountID: c.From,
		Type: c.Type, Status: ActionApplied, CreatedAt: c.CreatedAt}
	acc := w.acc[c.From]
	if acc == nil || acc.Kind != KindCustomer || acc.ClientID != c.ClientID {
		// The API sends only its client's own accounts: a command naming
		// another's, or none, was forged or corrupted on its way. Nothing
		// is recorded, and an operator sees it dead-lettered.
		return Outcome{Result: Invalid, Err: Errorf(CodeAccountNotFound, "account %s is not an account of client %s", c.From, c.ClientID)}
	}
	refuse := func(err *Error) Outcome {
		a.Status, a.Reason = ActionRejected, err.Code
		return Outcome{Action: a, Err: err, Result: Rejected}
	}
	switch {
	case acc.Closed:
		return refuse(Errorf(CodeAccountClosed, "account %s is closed", acc.ID))
	case c.Type == TypeClose && acc.Balance != 0:
		return refuse(Errorf(CodeAccountNotEmpty, "account %s holds %d: only an account with a zero balance can be closed", acc.ID, acc.Balance))
	case c.Type == TypeClose && acc.Held != 0:
		return refuse(Errorf(CodeAccountNotEmpty, "account %s has open holds of %d: capture or void them first", acc.ID, acc.Held))
	case c.Type == TypeClose && w.InFlight[acc.ID] > 0:
		return refuse(Errorf(CodeAccountNotEmpty, "account %s has %d transfers on their way to another region: a refusal would credit it back", acc.ID, w.InFlight[acc.ID]))
	case c.Type == TypeFreeze && acc.Frozen:
		return refuse(Errorf(CodeAccountFrozen, "account %s is frozen already", acc.ID))
	case c.Type == TypeUnfreeze && !acc.Frozen:
		return refuse(Errorf(CodeAccountNotFrozen, "account %s is not frozen", acc.ID))
	}
	switch c.Type {
	case TypeClose:
		acc.Closed = true
	case TypeFreeze:
		acc.Frozen = true
	case TypeUnfreeze:
		acc.Frozen = false
	}
	after := *acc
	return Outcome{Action: a, Account: &after, Result: Applied}
}

// credit applies the credit step in the destination region, or refuses it;
// either way a step goes back to the source region.
func (w *work) credit(c Command) Outcome {
	source, _ := w.Regions.HomeRegion(c.TransferID)
	cr := &Credit{TransferID: c.TransferID, From: c.From, To: c.To, Amount: c.Amount, Currency: c.Currency, CreatedAt: c.CreatedAt,
		RefundOf: c.RefundOf}
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
	case to == nil:
		return Errorf(CodeAccountNotFound, "destination account %s does not exist", c.To)
	case to.Kind != KindCustomer:
		return Errorf(CodeSystemAccount, "account %s is the region's %s account: money moves into customer accounts only", c.To, to.Kind)
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
		n := t.Moved()
		from, transit := w.acc[t.From], w.acc[w.Transit[t.Currency]]
		if from == nil || transit == nil || from.Balance > maxInt64-n {
			return Outcome{Transfer: *t, Result: Invalid, Err: Errorf(CodeBalanceOverflow, "refund of %d to %s cannot be posted", n, t.From)}
		}
		o.Postings = post(t.ID, transit, LegUnhold, from, LegRefund, n)
		t.Reason = c.Reason
		if t.RefundOf != "" {
			// A refund the payer's region refused is refundable again.
			if cr := w.credits[t.RefundOf]; cr != nil {
				cr.RefundedAmount -= n
			}
		}
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
	case from.Frozen:
		return nil, Errorf(CodeAccountFrozen, "source account %s is frozen: it takes credits, no debits", from.ID)
	case to.Closed:
		return nil, Errorf(CodeAccountClosed, "destination account %s is closed", to.ID)
	case from.Currency != c.Currency:
		return nil, Errorf(CodeCurrencyMismatch, "source account %s holds %s, not %s", from.ID, from.Currency, c.Currency)
	case to.Currency != c.Currency:
		return nil, Errorf(CodeCurrencyMismatch, "destination account %s holds %s, not %s", to.ID, to.Currency, c.Currency)
	case from.ID == to.ID:
		return nil, Errorf(CodeSameAccount, "source and destination are both %s", from.ID)
	case to.ID == c.To && to.Kind != KindCustomer:
		return nil, Errorf(CodeSystemAccount, "account %s is the region's %s account: money moves into customer accounts only", to.ID, to.Kind)
	case c.Type != TypeFund && from.Kind != KindCustomer:
		return nil, Errorf(CodeSystemAccount, "account %s is the region's %s account: money moves out of customer accounts only", from.ID, from.Kind)
	}
	// Available >= Floor always holds, so Available - Floor >= 0; it can
	// only overflow when the floor is far negative, and then funds are
	// ample.
	if room := from.Available() - from.Floor; room >= 0 && room < c.Amount {
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
