package ledger

import "time"

// Status is a transfer's place in its state machine.
type Status string

// Transfer statuses. COMPLETED, REFUNDED, REJECTED, VOIDED and EXPIRED are
// terminal. A hold (an authorization) is HELD until it is captured
// (COMPLETED, or DEBITED on its way to another region), voided or expired.
// REFUNDED is the saga's: a cross-region credit was refused and the money
// went back to the source. A client's refund of a transfer is a transfer of
// its own (Transfer.RefundOf).
const (
	StatusPending   Status = "PENDING"
	StatusHeld      Status = "HELD"
	StatusDebited   Status = "DEBITED"
	StatusCompleted Status = "COMPLETED"
	StatusRefunded  Status = "REFUNDED"
	StatusRejected  Status = "REJECTED"
	StatusVoided    Status = "VOIDED"
	StatusExpired   Status = "EXPIRED"
)

// Statuses lists every status.
func Statuses() []Status {
	return []Status{StatusPending, StatusHeld, StatusDebited, StatusCompleted, StatusRefunded, StatusRejected, StatusVoided, StatusExpired}
}

// Event moves a transfer from one status to the next.
type Event string

// Events of the transfer state machine.
const (
	// EventComplete debits and credits in one step (same-region transfer).
	EventComplete Event = "complete"
	// EventDebit debits the source; the credit happens elsewhere.
	EventDebit Event = "debit"
	// EventReject refuses the transfer with a reason; nothing is posted.
	EventReject Event = "reject"
	// EventConfirm records that the remote credit was applied.
	EventConfirm Event = "confirm"
	// EventRefund reverses the debit after the remote credit was refused.
	EventRefund Event = "refund"
	// EventHold reserves the amount on the source (an authorization).
	EventHold Event = "hold"
	// EventCapture captures a hold within its region: debit and credit.
	EventCapture Event = "capture"
	// EventCaptureDebit captures a hold whose destination is in another
	// region: the captured amount is debited into transit, and the credit
	// step follows as for a transfer.
	EventCaptureDebit Event = "capture_debit"
	// EventVoid releases a hold at its client's request.
	EventVoid Event = "void"
	// EventExpire releases a hold that was not captured by its expiry.
	EventExpire Event = "expire"
)

var transitions = map[Status]map[Event]Status{
	StatusPending: {EventComplete: StatusCompleted, EventDebit: StatusDebited, EventReject: StatusRejected, EventHold: StatusHeld},
	StatusHeld:    {EventCapture: StatusCompleted, EventCaptureDebit: StatusDebited, EventVoid: StatusVoided, EventExpire: StatusExpired},
	StatusDebited: {EventConfirm: StatusCompleted, EventRefund: StatusRefunded},
}

// Events lists every event.
func Events() []Event {
	return []Event{EventComplete, EventDebit, EventReject, EventConfirm, EventRefund, EventHold, EventCapture, EventCaptureDebit, EventVoid, EventExpire}
}

// Next returns the status that ev leads to from s, or an *Error with
// CodeIllegalTransition when the machine has no such edge (a repeated or
// out-of-order step). The machine has no cycles, so a transfer never returns
// to an earlier status.
func Next(s Status, ev Event) (Status, error) {
	if to, ok := transitions[s][ev]; ok {
		return to, nil
	}
	return "", Errorf(CodeIllegalTransition, "event %q is not allowed in status %s", ev, s)
}

// Legs lists the change-log legs a transfer in status s must have in its
// source region, the invariant `paymesh verify` checks. A cross-region
// transfer parks its money in the region's transit account (hold) until the
// destination region credits it, or gives it back (refund, unhold). A hold
// posts nothing until it is captured (it only reserves: Account.Held), and
// then the legs of the captured amount (Transfer.Moved).
func Legs(s Status, cross bool) []Leg {
	switch {
	case s == StatusCompleted && !cross:
		return []Leg{LegDebit, LegCredit}
	case s == StatusDebited, s == StatusCompleted:
		return []Leg{LegDebit, LegHold}
	case s == StatusRefunded:
		return []Leg{LegDebit, LegHold, LegRefund, LegUnhold}
	}
	return nil
}

// CreditStatus is the outcome of a credit step in the destination region.
type CreditStatus string

// Credit statuses.
const (
	CreditApplied CreditStatus = "CREDITED"
	CreditRefused CreditStatus = "REFUSED"
)

// CreditLegs lists the change-log legs of a credit in the destination region.
func CreditLegs(s CreditStatus) []Leg {
	if s == CreditApplied {
		return []Leg{LegCredit, LegRelease}
	}
	return nil
}

// Credit is the destination region's record of a cross-region credit step,
// unique per transfer: the business key of the credit.
type Credit struct {
	TransferID string
	From, To   string
	Amount     int64
	Currency   string
	Status     CreditStatus
	Reason     Code
	CreatedAt  time.Time
	// RefundOf names the transfer that a credited refund gives money back
	// for.
	RefundOf string
	// RefundedAmount sums the refunds of this credit's transfer that this
	// region's ledger decided (the payee is here).
	RefundedAmount int64
}

// OutboxMessage is the next saga step, written in the same transaction as
// the step that causes it and relayed to Region afterwards.
type OutboxMessage struct {
	Region  string  // the region whose ledger applies it
	Account string  // the account whose shard carries it
	Command Command // the step
	// DueAt holds the step back until then (a hold's expiry); zero: now.
	DueAt time.Time
}

// Transfer is the record of one transfer command, unique per client and
// idempotency key.
type Transfer struct {
	ID             string
	ClientID       string
	IdempotencyKey string
	Fingerprint    []byte
	From, To       string
	Amount         int64
	Currency       string
	Status         Status
	// Reason is the refusal code of a REJECTED transfer.
	Reason Code
	// Version counts the transitions applied; a compare-and-set on
	// (Status, Version) guards every change.
	Version   int64
	CreatedAt time.Time
	// ExpiresAt marks a hold: it expires then unless captured or voided.
	ExpiresAt time.Time
	// CapturedAmount is what the capture of a hold moved (0 before).
	CapturedAmount int64
	// RefundOf names the transfer a refund gives money back for.
	RefundOf string
	// RefundedAmount sums the refunds of this transfer that this region's
	// ledger decided: the refunds of a same-region transfer (the payee's
	// region decides them).
	RefundedAmount int64
	// Reference and Metadata are the client's, from the request.
	Reference string
	Metadata  map[string]string
}

// Refund is one refund of a transfer, as a region knows it: a refund
// transfer's status, or a credit's (CREDITED) for a refund credited here.
type Refund struct {
	ID     string
	Amount int64
	Status string
}

// IsHold reports whether t is an authorization (made with hold).
func (t Transfer) IsHold() bool { return !t.ExpiresAt.IsZero() }

// Moved is the amount t moves: what was captured of a hold, the amount of
// any other transfer.
func (t Transfer) Moved() int64 {
	if t.IsHold() {
		return t.CapturedAmount
	}
	return t.Amount
}

// Leg names a change-log row of a transfer.
type Leg string

// Change-log legs.
const (
	LegDebit   Leg = "debit"   // source account pays
	LegCredit  Leg = "credit"  // destination account receives
	LegHold    Leg = "hold"    // the source region's transit account takes a cross-region debit
	LegRelease Leg = "release" // the destination region's transit account pays the credit
	LegRefund  Leg = "refund"  // a refused cross-region transfer returns to the source account
	LegUnhold  Leg = "unhold"  // and leaves the source region's transit account
)

// Posting is one change-log row: a signed amount on one account, with the
// balance and account version it produced. A transfer has at most one
// posting per leg.
type Posting struct {
	TransferID     string
	Leg            Leg
	AccountID      string
	Amount         int64
	BalanceAfter   int64
	AccountVersion int64
	// CreatedAt is when the row was written; an account's rows carry
	// times in the order of their versions.
	CreatedAt time.Time
}

// Statement is an account's change-log over a period [From, To): the
// balance before the period (Opening) and at its end (Closing), and the
// rows written in it, in version order (a page of them, when read a page
// at a time).
type Statement struct {
	AccountID        string
	From, To         time.Time
	Opening, Closing int64
	Entries          []Posting
}

// Balance is an account's balance and held amount at an instant: the
// balance after its last change-log row written by then (Version, 0 before
// the first), and the sum of its holds open then.
type Balance struct {
	Balance, Held, Version int64
}

// Available is what a debit could have used at that instant.
func (b Balance) Available() int64 { return b.Balance - b.Held }

// ResultKind classifies what happened to one command of a batch.
type ResultKind int

// Result kinds.
const (
	// Applied: the transfer was recorded now (completed).
	Applied ResultKind = iota + 1
	// Rejected: the transfer was recorded now as REJECTED with a reason.
	Rejected
	// Duplicate: the command was already processed; Layer says who caught it.
	Duplicate
	// Conflict: the idempotency key was used before for another request.
	Conflict
	// Invalid: the command can never apply (malformed or misrouted).
	Invalid
	// Parked: a saga step arrived before the state it needs; let it be
	// redelivered later.
	Parked
	// AwaitingAccount: the request names an account that does not exist
	// (yet). Nothing was recorded and its claim was given back; it goes to
	// the dead-letter stream, from which a replay applies it once the
	// account exists (paymesh dlq replay).
	AwaitingAccount
)

func (k ResultKind) String() string {
	return [...]string{"unknown", "applied", "rejected", "duplicate", "conflict", "invalid", "parked", "awaiting_account"}[k]
}

// Result is the outcome of one command.
type Result struct {
	Kind     ResultKind
	Transfer Transfer // for Applied, Rejected and business-key duplicates
	Credit   *Credit  // for an applied credit step
	Err      *Error   // the reason for Rejected, Conflict, Invalid and AwaitingAccount
	Layer    Layer    // the dedup layer that caught a Duplicate or Conflict
	// FirstAt is, for a Duplicate, when the first effect of its key was
	// recorded, as the layer that caught it keeps it (a consume-log row's
	// claim, the business key's transfer); zero when that layer keeps no
	// time (AgeOf then measures from the request's creation).
	FirstAt time.Time
	// DeadLetter is set when the command goes to the dead-letter stream:
	// it can never apply as sent.
	DeadLetter bool
	// Answer is the first answer to a client request that the apply
	// transaction stored with the request's idempotency key (see
	// postgres.Answers), as stored; nil when it stored none.
	Answer *Answer
	// Action is, for a capture or void, its record: the one made now, or
	// for a duplicate the one made the first time (Transfer is then the
	// hold as it is now), so that a repeat is answered as the first was.
	// An account action's is its record too, with Account.
	Action *Action
	// Account is, for an account action, the account after it (for a
	// duplicate, as it is now).
	Account *Account
	// Outbox holds the saga steps the transaction wrote to the outbox for
	// this command, so that the consumer can publish those due now right
	// after COMMIT (ledgerstream.StepSender); the relay sends the rest.
	Outbox []OutboxMessage
}

// Answer is a client request's first answer, as the API sends it: an HTTP
// status and body. The ledger only carries it, from the transaction that
// stored it to the API process waiting for it.
type Answer struct {
	Status int
	Body   []byte
}

// Saga stages of a cross-region transfer, each timed from the transfer's
// creation (Command.CreatedAt) to the apply of the step that ends it.
const (
	// StageCredit ends when the destination region applies the credit step
	// (credited or refused there).
	StageCredit = "credit"
	// StageSettle ends when the source region applies the confirm step:
	// the transfer is COMPLETED.
	StageSettle = "settle"
	// StageRefund ends when the source region applies the refuse step:
	// the transfer is REFUNDED.
	StageRefund = "refund"
)

// SagaStage names the saga stage that applying c with result r ended, or ""
// when it ended none: a client request, or a step that did not apply now
// (a duplicate, a parked or an invalid step), so that each stage of a
// transfer counts once however often its step is delivered.
func SagaStage(c Command, r Result) string {
	if r.Kind != Applied {
		return ""
	}
	switch c.Type {
	case TypeCredit:
		return StageCredit
	case TypeConfirm:
		return StageSettle
	case TypeRefuse:
		return StageRefund
	}
	return ""
}
