package ledger

import (
	"strconv"
	"strings"
	"time"
)

// EventType names an event: a state change that clients read in the event
// feed (GET /v1/events) and receive by webhook. The ledger emits the events
// of a change in the transaction that makes it.
type EventType string

// The events of transfers, refunds and accounts. A transfer emits created
// when it is recorded, then one event for each status it reaches (a
// transfer debited into transit emits nothing more until the saga ends it);
// a refund, which is a transfer of its own, emits the same under refund.
const (
	TransferCreated   EventType = "transfer.created"
	TransferCompleted EventType = "transfer.completed"
	TransferRejected  EventType = "transfer.rejected"
	// TransferRefunded: the remote credit of a cross-region transfer was
	// refused, and the debit given back.
	TransferRefunded EventType = "transfer.refunded"
	TransferHeld     EventType = "transfer.held"
	// TransferCaptured: a hold was captured; completed follows (in the
	// same transaction within a region, after the saga across regions).
	TransferCaptured EventType = "transfer.captured"
	TransferVoided   EventType = "transfer.voided"
	TransferExpired  EventType = "transfer.expired"

	RefundCreated   EventType = "refund.created"
	RefundCompleted EventType = "refund.completed"
	RefundRejected  EventType = "refund.rejected"
	// RefundFailed: the payer's region refused the refund's credit, and
	// the money went back to the payee.
	RefundFailed EventType = "refund.failed"

	AccountOpened   EventType = "account.opened"
	AccountClosed   EventType = "account.closed"
	AccountFrozen   EventType = "account.frozen"
	AccountUnfrozen EventType = "account.unfrozen"

	// WebhookEndpointDisabled: a webhook endpoint's deliveries kept
	// failing until one failed for good, and the endpoint was disabled
	// (services/webhooks). Its events are ordered by the endpoint's ID.
	WebhookEndpointDisabled EventType = "webhook_endpoint.disabled"
)

// EventTypes lists every event type, in the order of the constants.
func EventTypes() []EventType {
	return []EventType{TransferCreated, TransferCompleted, TransferRejected, TransferRefunded, TransferHeld, TransferCaptured,
		TransferVoided, TransferExpired, RefundCreated, RefundCompleted, RefundRejected, RefundFailed,
		AccountOpened, AccountClosed, AccountFrozen, AccountUnfrozen, WebhookEndpointDisabled}
}

// Account states in an account event's snapshot (Emitted.Status).
const (
	AccountOpen     = "open"
	AccountIsFrozen = "frozen"
	AccountIsClosed = "closed"
)

// Emitted is one event as the ledger records it: what changed, for whom,
// and the changed fields of the object as they were then; the rest of the
// object (a transfer's accounts, amount, labels) never changes, and is read
// with it.
type Emitted struct {
	Type EventType
	// Account orders the event: its per-account sequence, assigned when
	// the event is recorded, has no gaps. For a transfer it is the source
	// (the account whose region holds the transfer), for a funding the
	// account funded.
	Account string
	// Client made the change. The event is recorded in the feed of
	// Account's owner, so that the owner sees every event of the account;
	// Client is the feed of an event whose account the ledger does not
	// hold (a refusal naming an unknown account).
	Client string
	// Object is the transfer's ID, or the account's (the endpoint's) for
	// an account (endpoint) event.
	Object string
	// Status is the transfer's status after the change, or for an account
	// event the account's state (AccountOpen, AccountIsFrozen,
	// AccountIsClosed); Reason a rejection's code, or why an endpoint was
	// disabled.
	Status  string
	Reason  Code
	Version int64
	// Captured is what a hold's capture moved.
	Captured int64
}

// IsAccount reports whether the event's object is an account.
func (t EventType) IsAccount() bool {
	switch t {
	case AccountOpened, AccountClosed, AccountFrozen, AccountUnfrozen:
		return true
	}
	return false
}

// IsEndpoint reports whether the event's object is a webhook endpoint.
func (t EventType) IsEndpoint() bool { return t == WebhookEndpointDisabled }

// IsTransfer reports whether the event's object is a transfer (or a
// refund).
func (t EventType) IsTransfer() bool { return t.Valid() && !t.IsAccount() && !t.IsEndpoint() }

// Valid reports whether t is an event type.
func (t EventType) Valid() bool {
	for _, x := range EventTypes() {
		if x == t {
			return true
		}
	}
	return false
}

// CheckEventTypes refuses a type that is no event's, or one given twice
// (a feed's filter, a webhook endpoint's types).
func CheckEventTypes(types []EventType) error {
	for i, t := range types {
		if !t.Valid() {
			return Errorf(CodeInvalidRequest, "type %.40q is no event type (%v)", t, EventTypes())
		}
		for _, u := range types[:i] {
			if u == t {
				return Errorf(CodeInvalidRequest, "type %.40q is given twice", t)
			}
		}
	}
	return nil
}

// statusEvents is the event of each status a transfer (or a refund) may
// reach; DEBITED has none: created says it.
var statusEvents = map[bool]map[Status]EventType{
	false: {StatusCompleted: TransferCompleted, StatusRejected: TransferRejected, StatusRefunded: TransferRefunded,
		StatusHeld: TransferHeld, StatusVoided: TransferVoided, StatusExpired: TransferExpired},
	true: {StatusCompleted: RefundCompleted, StatusRejected: RefundRejected, StatusRefunded: RefundFailed},
}

// StatusEvent is the event of a transfer (or a refund) reaching status s,
// if that status has one.
func StatusEvent(refund bool, s Status) (EventType, bool) {
	t, ok := statusEvents[refund][s]
	return t, ok
}

// AppendEvents appends to dst the events of command c's outcome o, in the
// order they happened, and returns the extended slice (the apply loop
// reuses one buffer, so a batch allocates none per command): a recorded transfer's created and the status it reached, a
// transfer's move to its next status (a capture's captured first), an
// account action's change. A duplicate, a refusal that records nothing and
// a credit step (the payee's region) emit none.
func AppendEvents(dst []Emitted, c Command, o Outcome) []Emitted {
	switch {
	case c.IsAccountAction():
		if o.Result != Applied || o.Account == nil {
			return dst
		}
		return append(dst, accountEvent(o.Account, c.Type))
	case o.Credit != nil, c.IsStep() && o.Result != Applied, c.IsAction() && o.Result != Applied:
		return dst
	}
	t := o.Transfer
	refund := t.RefundOf != "" || c.Type == TypeRefund
	e := Emitted{Account: t.From, Client: t.ClientID, Object: t.ID, Status: string(t.Status), Reason: t.Reason,
		Version: t.Version, Captured: t.CapturedAmount}
	if c.Type == TypeFund || t.From == "" {
		e.Account = t.To
	}
	switch {
	case o.FromStatus == "" && (o.Result == Applied || o.Result == Rejected):
		e.Type = TransferCreated
		if refund {
			e.Type = RefundCreated
		}
		dst = append(dst, e)
	case o.FromStatus == "" || o.Result != Applied:
		return dst
	case o.FromStatus == StatusHeld && (t.Status == StatusCompleted || t.Status == StatusDebited):
		e.Type = TransferCaptured
		dst = append(dst, e)
	}
	if typ, ok := statusEvents[refund][t.Status]; ok {
		e.Type = typ
		dst = append(dst, e)
	}
	return dst
}

// accountEvent is the event of an account action applied to a.
func accountEvent(a *Account, action string) Emitted {
	e := Emitted{Account: a.ID, Client: a.ClientID, Object: a.ID, Status: AccountOpen}
	switch {
	case a.Closed:
		e.Status = AccountIsClosed
	case a.Frozen:
		e.Status = AccountIsFrozen
	}
	switch action {
	case TypeClose:
		e.Type = AccountClosed
	case TypeFreeze:
		e.Type = AccountFrozen
	default:
		e.Type = AccountUnfrozen
	}
	return e
}

// OpenedEvent is the event of an account opened.
func OpenedEvent(a Account) Emitted {
	return Emitted{Type: AccountOpened, Account: a.ID, Client: a.ClientID, Object: a.ID, Status: AccountOpen}
}

// EndpointDisabledEvent is the event of webhook endpoint id of client
// disabled for reason (Emitted.Reason holds the reason's text; the status
// is "disabled").
func EndpointDisabledEvent(id, client, reason string) Emitted {
	return Emitted{Type: WebhookEndpointDisabled, Account: id, Client: client, Object: id, Status: "disabled", Reason: Code(reason)}
}

// EventFilter selects a client's events, oldest first.
type EventFilter struct {
	Client string
	// Types, when set, keeps only these types.
	Types []EventType
	// After is the position of the last event read here (nil: the
	// oldest kept).
	After *EventPosition
}

// EventPosition is a place in a region's feed: the writing transaction,
// then the account and its sequence.
type EventPosition struct {
	Tx       uint64 `json:"tx"`
	Account  string `json:"account"`
	Sequence int64  `json:"seq"`
}

// EventRef names one event: its account and its place in the account's
// sequence. Its ID, in the feed and in webhook deliveries, is
// "<account>.<sequence>".
type EventRef struct {
	Account  string
	Sequence int64
}

// ID returns the event's ID.
func (r EventRef) ID() string { return r.Account + "." + strconv.FormatInt(r.Sequence, 10) }

// ParseEventID reads an event's ID; it checks the form alone (an
// account's ID, a dot, a positive sequence), not that the event exists.
func ParseEventID(id string) (EventRef, error) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 {
		return EventRef{}, Errorf(CodeInvalidRequest, "%.80q is not an event ID (<account>.<sequence>)", id)
	}
	n, err := strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil || n < 1 || id[i+1] == '+' || id[i+1] == '0' {
		return EventRef{}, Errorf(CodeInvalidRequest, "%.80q is not an event ID: its sequence is not a positive number", id)
	}
	return EventRef{Account: id[:i], Sequence: n}, nil
}

// RecordedEvent is one recorded event and its object as it was: a transfer's or
// an account's row, with the event's snapshot of the fields that change.
type RecordedEvent struct {
	Emitted
	Sequence  int64
	Position  EventPosition
	CreatedAt time.Time
	// Transfer or Opened is the object (by Emitted.Type.IsAccount); an
	// endpoint's event has its snapshot alone (Emitted.Status, Reason).
	Transfer Transfer
	Opened   Account
}
