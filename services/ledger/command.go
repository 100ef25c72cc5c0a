package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"time"
	"unicode"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/paymesh/paymesh/pkg/idgen"
)

// Command types.
const (
	// TypeTransfer moves money between two accounts.
	TypeTransfer = "transfer"
	// TypeFund draws money from the region's issuance account of the
	// currency into an account. Its From is empty.
	TypeFund = "fund"
	// TypeCredit is the saga step that credits the destination of a
	// cross-region transfer in the destination's home region.
	TypeCredit = "credit"
	// TypeConfirm tells the source region that the credit was applied.
	TypeConfirm = "confirm"
	// TypeRefuse tells the source region that the credit was refused, with
	// the reason; the source refunds.
	TypeRefuse = "refuse"
	// TypeCapture captures a hold (TransferID), all of it or Amount; the
	// rest is released. It applies in the hold's region.
	TypeCapture = "capture"
	// TypeVoid releases a hold (TransferID) at its client's request.
	TypeVoid = "void"
	// TypeExpire is the step that releases a hold not captured by its
	// expiry; the hold's transaction queues it in the outbox, due then.
	TypeExpire = "expire"
	// TypeRefund gives money back for a completed transfer (RefundOf): a
	// transfer from that transfer's payee (From) to its payer (To) of
	// Amount, or of all that is still refundable when Amount is 0. It
	// applies in the payee's region, which decides every refund of the
	// transfer, and runs as a saga when the payer is in another region.
	TypeRefund = "refund"
	// TypeClose closes an account (From) for good: it takes no debit or
	// credit after. It needs a zero balance, no open hold and nothing on
	// its way out to another region.
	TypeClose = "close"
	// TypeFreeze stops an account's (From) debits; credits still land.
	TypeFreeze = "freeze"
	// TypeUnfreeze lets a frozen account's debits through again.
	TypeUnfreeze = "unfreeze"
)

// Hold expiries.
const (
	// DefaultHoldExpiry is how long a hold lasts when the request names no
	// expiry.
	DefaultHoldExpiry = 7 * 24 * time.Hour
	// MaxHoldExpiry is the longest a hold may last.
	MaxHoldExpiry = 30 * 24 * time.Hour
)

// IsStep reports whether the command is a saga step rather than a client
// request.
func (c Command) IsStep() bool {
	return c.Type == TypeCredit || c.Type == TypeConfirm || c.Type == TypeRefuse || c.Type == TypeExpire
}

// SentFrom returns the region whose ledger sends a saga step: a credit
// comes from its transfer's source region, a confirm or refuse from the
// destination region that applied or refused the credit, an expiry from
// the hold's own region. It returns an error for a command that is not a
// step or names an ID of no region.
func (c Command) SentFrom(ids *idgen.Regions) (string, error) {
	account := c.From
	switch c.Type {
	case TypeCredit, TypeExpire:
	case TypeConfirm, TypeRefuse:
		account = c.To
	default:
		return "", Errorf(CodeInvalidRequest, "a %s is not a saga step", c.Type)
	}
	r, err := ids.HomeRegion(account)
	if err != nil {
		return "", Errorf(CodeInvalidRequest, "%s: %v", account, err)
	}
	return r, nil
}

// Account returns the account whose home region applies the command and
// whose ledger shard carries it: the destination for a fund or a credit,
// the source for every other kind.
func (c Command) Account() string {
	if commandKinds[c.Type].atDestination {
		return c.To
	}
	return c.From
}

// IsAction reports whether the command acts on an existing hold (capture,
// void) instead of making a transfer. It names the hold (TransferID) and
// carries the hold's accounts and currency, which the ledger checks
// against the hold.
func (c Command) IsAction() bool { return c.Type == TypeCapture || c.Type == TypeVoid }

// IsAccountAction reports whether the command changes an account's state
// (close, freeze, unfreeze) instead of moving money. It names the account
// (From) and nothing else: no transfer, destination, amount or currency.
func (c Command) IsAccountAction() bool {
	return c.Type == TypeClose || c.Type == TypeFreeze || c.Type == TypeUnfreeze
}

// IsKeyedAction reports whether the command is a client's request whose
// business key is its record of an action (transfer_actions,
// account_actions) rather than a transfer: a capture or void, or an
// account action.
func (c Command) IsKeyedAction() bool { return c.IsAction() || c.IsAccountAction() }

// MaxCommandBytes bounds an encoded command: room for metadata at its
// limits, every byte of it escaped as encoding/json writes it (a '<' takes
// six).
const MaxCommandBytes = 64 << 10

// Command asks the ledger to move money. Its identity is (ClientID,
// IdempotencyKey): every delivery and every retry of the same request carries
// the same pair, and the ledger applies it at most once.
type Command struct {
	Type           string    `json:"type"`
	TransferID     string    `json:"transfer_id"`
	ClientID       string    `json:"client_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	From           string    `json:"from,omitempty"`
	To             string    `json:"to"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	CreatedAt      time.Time `json:"created_at"`
	// Reason is why a credit was refused (refuse steps only).
	Reason Code `json:"reason,omitempty"`
	// Hold makes a transfer an authorization: the amount is reserved on
	// the source until it is captured, voided or expires at ExpiresAt.
	Hold      bool      `json:"hold,omitempty"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// RefundOf names the transfer a refund (and its saga steps) gives
	// money back for.
	RefundOf string `json:"refund_of,omitempty"`
	// Reference is the client's own ID of the request (an order or payment
	// ID), unique among the client's transfers recorded in this region and
	// not refused; Metadata is the client's, kept with the transfer. Both
	// are part of the request (the fingerprint); only a transfer, fund or
	// refund takes them.
	Reference string            `json:"reference,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// KeyExpiresAt is set, on a client request, by an API that did not
	// claim the request's idempotency key before submitting it: the apply
	// transaction stores the key, with the request's first answer, kept
	// until then (see postgres.Answers). It is not part of the request's
	// identity (not in the fingerprint).
	KeyExpiresAt time.Time `json:"key_expires_at,omitzero"`
	// Trace is the W3C traceparent of the delivery that applies the
	// command; it is not part of the command (not encoded, not in the
	// fingerprint) and travels with the saga steps it causes.
	Trace string `json:"-"`
}

// MsgKey is the command's deterministic message key: the consume-log key and
// the Nats-Msg-Id of every publish of it. A client request is keyed by its
// client and idempotency key, a saga step by its transfer and step.
func (c Command) MsgKey() string {
	if c.IsStep() {
		return "step/" + c.TransferID + "/" + c.Type
	}
	return "xfer/" + c.ClientID + "/" + c.IdempotencyKey
}

// Step returns the saga step of type typ that follows c.
func (c Command) Step(typ string, reason Code) Command {
	return Command{Type: typ, TransferID: c.TransferID, ClientID: c.ClientID, IdempotencyKey: c.IdempotencyKey,
		From: c.From, To: c.To, Amount: c.Amount, Currency: c.Currency, CreatedAt: c.CreatedAt, Reason: reason,
		RefundOf: c.RefundOf, Trace: c.Trace}
}

// StepOf returns the saga step of type typ for the transfer t moving
// amount: the credit of a captured hold, a hold's expiry.
func StepOf(t Transfer, typ string, amount int64, trace string) Command {
	c := Command{Type: typ, TransferID: t.ID, ClientID: t.ClientID, IdempotencyKey: t.IdempotencyKey,
		From: t.From, To: t.To, Amount: amount, Currency: t.Currency, CreatedAt: t.CreatedAt, RefundOf: t.RefundOf, Trace: trace}
	if typ == TypeExpire {
		c.ExpiresAt = t.ExpiresAt
	}
	return c
}

// Fingerprint hashes the fields that define the request, so that the same
// key sent with a different request is detected.
func (c Command) Fingerprint() []byte {
	from := c.From
	if c.Type == TypeFund {
		from = "" // the ledger fills in the issuance account
	}
	h := sha256.New()
	for _, s := range []string{c.Type, from, c.To, c.Currency} {
		writeField(h, s)
	}
	_ = binary.Write(h, binary.BigEndian, c.Amount)
	// Fields of the later request kinds, only when set: the fingerprints of
	// plain transfers stay what they were.
	// A hold's expiry is not part of the request: the API sets a default
	// one from the time of each attempt, and a retry is the same request.
	if c.Hold {
		io.WriteString(h, "hold")
	}
	if c.RefundOf != "" {
		io.WriteString(h, "refund_of")
		io.WriteString(h, c.RefundOf)
	}
	if c.IsAction() {
		io.WriteString(h, c.TransferID) // the hold acted on
	}
	WriteLabels(h, c.Reference, c.Metadata)
	return h.Sum(nil)
}

// WriteLabels writes a request's reference and metadata, when it has
// them, to the hash h of its fingerprint: length-prefixed, the keys
// sorted, so that no two requests hash alike and a request without them
// hashes as before they existed.
func WriteLabels(h io.Writer, reference string, metadata map[string]string) {
	if reference != "" {
		io.WriteString(h, "reference")
		writeField(h, reference)
	}
	if len(metadata) > 0 {
		io.WriteString(h, "metadata")
		_ = binary.Write(h, binary.BigEndian, uint32(len(metadata)))
		for _, k := range slices.Sorted(maps.Keys(metadata)) {
			writeField(h, k)
			writeField(h, metadata[k])
		}
	}
}

// writeField writes s to h after its length.
func writeField(h io.Writer, s string) {
	_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
	io.WriteString(h, s)
}

// Encode returns the command's JSON form.
func (c Command) Encode() []byte {
	b, _ := json.Marshal(c) // cannot fail: plain fields only
	return b
}

// wireCommand is a command as decoded: the amount stays raw so that
// fractions, exponents and values beyond int64 get a precise error instead
// of a silent rounding.
type wireCommand struct {
	Type           string            `json:"type"`
	TransferID     string            `json:"transfer_id"`
	ClientID       string            `json:"client_id"`
	IdempotencyKey string            `json:"idempotency_key"`
	From           string            `json:"from"`
	To             string            `json:"to"`
	Amount         jsontext.Value    `json:"amount"`
	Currency       string            `json:"currency"`
	CreatedAt      time.Time         `json:"created_at"`
	Reason         Code              `json:"reason"`
	Hold           bool              `json:"hold"`
	ExpiresAt      time.Time         `json:"expires_at"`
	RefundOf       string            `json:"refund_of"`
	Reference      string            `json:"reference"`
	Metadata       map[string]string `json:"metadata"`
	KeyExpiresAt   time.Time         `json:"key_expires_at"`
}

// DecodeCommand parses a command strictly, in one pass: unknown fields,
// fields given twice (where a lenient decoder lets the last win), names that
// match a field only case-insensitively, invalid UTF-8, trailing data,
// oversize input and an amount that is not a plain integer in int64 are all
// refused with a coded error. It uses the JSON v2 decoder
// (github.com/go-json-experiment/json), which does all of that by itself.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) > MaxCommandBytes {
		return Command{}, Errorf(CodeInvalidRequest, "command is %d bytes, over the %d-byte limit", len(b), MaxCommandBytes)
	}
	var w wireCommand
	if err := jsonv2.Unmarshal(b, &w, jsonv2.RejectUnknownMembers(true)); err != nil {
		return Command{}, Errorf(CodeInvalidRequest, "decode command: %v", err)
	}
	if k := w.Amount.Kind(); len(w.Amount) > 0 && k != '0' {
		return Command{}, Errorf(CodeInvalidAmount, "amount must be a JSON integer, got %s", w.Amount)
	}
	amount, err := ParseAmount(string(w.Amount))
	if err != nil {
		return Command{}, err
	}
	return Command{Type: w.Type, TransferID: w.TransferID, ClientID: w.ClientID, IdempotencyKey: w.IdempotencyKey,
		From: w.From, To: w.To, Amount: amount, Currency: w.Currency, CreatedAt: w.CreatedAt, Reason: w.Reason,
		Hold: w.Hold, ExpiresAt: w.ExpiresAt, RefundOf: w.RefundOf, Reference: w.Reference, Metadata: w.Metadata,
		KeyExpiresAt: w.KeyExpiresAt}, nil
}

// ParseAmount parses integer minor units written in canonical decimal
// (no sign but a leading minus, no leading zeros). Fractions, exponents,
// other spellings and values beyond int64 are refused with
// CodeInvalidAmount; zero and negatives parse here and are refused by
// Validate.
func ParseAmount(s string) (int64, error) {
	if s == "" {
		return 0, Errorf(CodeInvalidAmount, "amount is missing")
	}
	if !amountRE.MatchString(s) {
		return 0, Errorf(CodeInvalidAmount, "amount %q must be an integer number of minor units", s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, Errorf(CodeInvalidAmount, "amount %q is not an integer in the int64 range", s)
	}
	return n, nil
}

var amountRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// MaxClockSkew is how far in the future a command's created_at may be.
const MaxClockSkew = 5 * time.Minute

// Validate checks a decoded command against the ledger of region home at
// time now. It returns an *Error; an error here means the command can never
// apply.
func (c Command) Validate(home string, ids *idgen.Regions, now time.Time) error {
	if err := c.validateFields(now); err != nil {
		return err
	}
	if c.IsAccountAction() {
		return c.validateAccountAction(home, ids)
	}
	r, err := c.regions(ids)
	if err != nil {
		return err
	}
	kind, ok := commandKinds[c.Type]
	if !ok {
		return Errorf(CodeInvalidRequest, "type %q is not one of transfer, fund, capture, void, refund, close, freeze, unfreeze, credit, confirm, refuse, expire", c.Type)
	}
	if kind.check != nil {
		if err := kind.check(c, r); err != nil {
			return err
		}
	}
	if where := kind.appliesIn(r); where != home {
		return Errorf(CodeWrongRegion, "a %s of %s->%s applies in region %s, not %s", c.Type, c.From, c.To, where, home)
	}
	if c.Type != TypeRefuse && c.Reason != "" {
		return Errorf(CodeInvalidRequest, "only a refuse step has a reason")
	}
	if c.RefundOf != "" && c.Type != TypeRefund && !c.IsStep() {
		return Errorf(CodeInvalidRequest, "only a refund has refund_of")
	}
	return nil
}

// validateFields checks the fields that need no region: the request's
// identity, its creation time, its amount and currency, and its hold.
func (c Command) validateFields(now time.Time) error {
	if err := validKeyPart("client_id", c.ClientID, 64); err != nil {
		return err
	}
	if err := validKeyPart("idempotency_key", c.IdempotencyKey, 255); err != nil {
		return err
	}
	if c.CreatedAt.IsZero() {
		return Errorf(CodeInvalidRequest, "created_at is missing")
	}
	// A saga step carries its transfer's created_at, checked in the source
	// region already; another region's clock must not refuse it.
	if !c.IsStep() && c.CreatedAt.After(now.Add(MaxClockSkew)) {
		return Errorf(CodeInvalidRequest, "created_at %s is more than %s in the future", c.CreatedAt.Format(time.RFC3339), MaxClockSkew)
	}
	if err := c.validateLabels(); err != nil {
		return err
	}
	if c.IsAccountAction() {
		return nil // its fields are its own (validateAccountAction)
	}
	if err := c.validateAmount(); err != nil {
		return err
	}
	return c.validateHold()
}

// validateLabels checks a request's reference and metadata: only a
// transfer, fund or refund has them, within their limits.
func (c Command) validateLabels() error {
	if c.Reference == "" && c.Metadata == nil {
		return nil
	}
	if c.IsStep() || c.IsKeyedAction() {
		return Errorf(CodeInvalidRequest, "a %s has no reference or metadata", c.Type)
	}
	return ValidLabels(c.Reference, c.Metadata)
}

// validateAccountAction checks a close, freeze or unfreeze: it names one
// account of region home and carries nothing else.
func (c Command) validateAccountAction(home string, ids *idgen.Regions) error {
	if c.TransferID != "" || c.To != "" || c.Amount != 0 || c.Currency != "" || c.Hold || !c.ExpiresAt.IsZero() ||
		c.RefundOf != "" || c.Reason != "" {
		return Errorf(CodeInvalidRequest, "a %s names its account (from) and nothing else", c.Type)
	}
	where, err := ids.HomeRegion(c.From)
	if err != nil {
		return Errorf(CodeInvalidRequest, "from: %v", err)
	}
	if where != home {
		return Errorf(CodeWrongRegion, "a %s of %s applies in region %s, not %s", c.Type, c.From, where, home)
	}
	return nil
}

// validateAmount checks the amount and the currency. A capture or refund
// without an amount takes all there is; a void takes none.
func (c Command) validateAmount() error {
	switch {
	case c.Type == TypeVoid && c.Amount != 0:
		return Errorf(CodeInvalidAmount, "a void has no amount, got %d", c.Amount)
	case c.Amount < 0, c.Amount == 0 && c.Type != TypeRefund && c.Type != TypeCapture && c.Type != TypeVoid:
		return Errorf(CodeInvalidAmount, "amount %d must be positive", c.Amount)
	case !ValidCurrency(c.Currency):
		return Errorf(CodeInvalidCurrency, "currency %q is not an ISO 4217 currency code", c.Currency)
	}
	return nil
}

// validateHold checks a hold's fields: only a transfer may be a hold, and
// its expiry lies after its creation, at most MaxHoldExpiry later.
func (c Command) validateHold() error {
	switch {
	case c.Hold && c.Type != TypeTransfer:
		return Errorf(CodeInvalidRequest, "only a transfer can be a hold")
	case c.IsAction() && c.RefundOf != "":
		return Errorf(CodeInvalidRequest, "a %s has no refund_of", c.Type)
	case !c.Hold && !c.ExpiresAt.IsZero() && c.Type != TypeExpire:
		return Errorf(CodeInvalidRequest, "expires_at belongs to a hold")
	case c.Hold && !c.ExpiresAt.After(c.CreatedAt):
		return Errorf(CodeInvalidRequest, "expires_at %s is not after the hold's creation", c.ExpiresAt.Format(time.RFC3339))
	case c.Hold && c.ExpiresAt.After(c.CreatedAt.Add(MaxHoldExpiry)):
		return Errorf(CodeInvalidRequest, "expires_at %s is more than %s after the hold's creation", c.ExpiresAt.Format(time.RFC3339), MaxHoldExpiry)
	}
	return nil
}

// commandRegions are the home regions of the ids a command names; from is
// empty for a fund, refundOf when the command names no refunded transfer.
type commandRegions struct {
	transfer, from, to, refundOf string
}

// regions resolves the home regions of the ids the command names. A command
// with a source must name two accounts, and its transfer id must come from
// the source's region.
func (c Command) regions(ids *idgen.Regions) (commandRegions, error) {
	var r commandRegions
	var err error
	if r.transfer, err = ids.HomeRegion(c.TransferID); err != nil {
		return r, Errorf(CodeInvalidRequest, "transfer_id: %v", err)
	}
	if r.to, err = ids.HomeRegion(c.To); err != nil {
		return r, Errorf(CodeInvalidRequest, "to: %v", err)
	}
	if c.Type != TypeFund {
		if r.from, err = ids.HomeRegion(c.From); err != nil {
			return r, Errorf(CodeInvalidRequest, "from: %v", err)
		}
		if c.From == c.To {
			return r, Errorf(CodeSameAccount, "source and destination are both %s", c.From)
		}
		if r.from != r.transfer {
			return r, Errorf(CodeInvalidRequest, "transfer_id %s is not from the source account's region %s", c.TransferID, r.from)
		}
	}
	if c.RefundOf != "" {
		if r.refundOf, err = ids.HomeRegion(c.RefundOf); err != nil {
			return r, Errorf(CodeInvalidRequest, "refund_of: %v", err)
		}
	}
	return r, nil
}

// commandKind is what Validate knows of one command type.
type commandKind struct {
	// atDestination: the command applies in the region of its destination
	// account; every other applies in its source's.
	atDestination bool
	// check validates the fields particular to the type; nil when there
	// are none.
	check func(Command, commandRegions) error
}

// appliesIn returns the region whose ledger applies a command of the kind.
func (k commandKind) appliesIn(r commandRegions) string {
	if k.atDestination {
		return r.to
	}
	return r.from
}

// commandKinds holds every command type the ledger applies.
var commandKinds = map[string]commandKind{
	TypeTransfer: {},
	TypeFund:     {atDestination: true, check: Command.validateFund},
	TypeCapture:  {},
	TypeVoid:     {},
	TypeRefund:   {check: Command.validateRefund},
	TypeCredit:   {atDestination: true, check: Command.validateCrossRegion},
	TypeConfirm:  {check: Command.validateCrossRegion},
	TypeRefuse:   {check: Command.validateRefuse},
	TypeExpire:   {check: Command.validateExpire},
}

// validateFund checks a fund: it has no source (the ledger fills in the
// issuance account) and its transfer id is from the account's region.
func (c Command) validateFund(r commandRegions) error {
	if c.From != "" {
		return Errorf(CodeInvalidRequest, "a fund command has no from account")
	}
	if r.transfer != r.to {
		return Errorf(CodeInvalidRequest, "transfer_id %s is not from the account's region %s", c.TransferID, r.to)
	}
	return nil
}

// validateRefund checks that a refund names the transfer it refunds, made
// in its payer's region: this refund's destination.
func (c Command) validateRefund(r commandRegions) error {
	if c.RefundOf == "" {
		return Errorf(CodeInvalidRequest, "a refund names the transfer it refunds (refund_of)")
	}
	if r.refundOf != r.to {
		return Errorf(CodeInvalidRequest, "refund_of %s is not from the payer's region %s", c.RefundOf, r.to)
	}
	return nil
}

// validateCrossRegion checks that a credit or confirm step belongs to a
// cross-region transfer.
func (c Command) validateCrossRegion(r commandRegions) error {
	if r.from == r.to {
		return Errorf(CodeInvalidRequest, "a %s step belongs to a cross-region transfer", c.Type)
	}
	return nil
}

// validateRefuse checks that a refuse step belongs to a cross-region
// transfer and carries the reason of the refusal.
func (c Command) validateRefuse(r commandRegions) error {
	if err := c.validateCrossRegion(r); err != nil {
		return err
	}
	if c.Reason == "" {
		return Errorf(CodeInvalidRequest, "a refuse step needs a reason")
	}
	return nil
}

// validateExpire checks that an expire step carries its hold's expiry.
func (c Command) validateExpire(commandRegions) error {
	if c.ExpiresAt.IsZero() {
		return Errorf(CodeInvalidRequest, "an expire step carries its hold's expires_at")
	}
	return nil
}

// ValidClientID returns an *Error unless id can identify a client in the
// ledger's records: 1-64 printable ASCII characters without '/'.
func ValidClientID(id string) error { return validKeyPart("client_id", id, 64) }

// ValidIdempotencyKey returns an *Error unless key can be a client's
// idempotency key: 1-255 printable ASCII characters without '/'.
func ValidIdempotencyKey(key string) error { return validKeyPart("idempotency_key", key, 255) }

func validKeyPart(field, s string, maxLen int) error {
	if s == "" || len(s) > maxLen {
		return Errorf(CodeInvalidRequest, "%s must be 1-%d characters", field, maxLen)
	}
	for _, r := range s {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || r == '/' {
			return Errorf(CodeInvalidRequest, "%s has a character outside printable ASCII or a '/': %s", field, strconv.Quote(s))
		}
	}
	return nil
}

// String describes the command for logs.
func (c Command) String() string {
	return fmt.Sprintf("%s %s %s->%s %d %s", c.Type, c.MsgKey(), c.From, c.To, c.Amount, c.Currency)
}
