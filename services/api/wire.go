package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/paymesh/paymesh/services/ledger"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 16 << 10

// MaxPageLimit bounds the limit of a page (an account's entries, the dead
// letters).
const MaxPageLimit = 500

// checkBodySize refuses a body of n bytes over MaxBodyBytes.
func checkBodySize(n int) error {
	if n > MaxBodyBytes {
		return ledger.Errorf(CodeBodyTooLarge, "body is over the %d-byte limit", MaxBodyBytes)
	}
	return nil
}

// parseLimit reads the limit of a page from a query: 1 to MaxPageLimit.
func parseLimit(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || checkLimit(n) != nil {
		return 0, ledger.Errorf(ledger.CodeInvalidRequest, "limit=%q is not between 1 and %d", v, MaxPageLimit)
	}
	return n, nil
}

// checkLimit refuses the limit of a page outside 1 to MaxPageLimit.
func checkLimit(n int) error {
	if n < 1 || n > MaxPageLimit {
		return ledger.Errorf(ledger.CodeInvalidRequest, "limit=%d is not between 1 and %d", n, MaxPageLimit)
	}
	return nil
}

// parseAfter reads the version cursor of a page of entries from a query.
func parseAfter(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || checkAfter(n) != nil {
		return 0, ledger.Errorf(ledger.CodeInvalidRequest, "after=%q is not a version number", v)
	}
	return n, nil
}

// checkAfter refuses a negative version cursor.
func checkAfter(n int64) error {
	if n < 0 {
		return ledger.Errorf(ledger.CodeInvalidRequest, "after=%d is not a version number", n)
	}
	return nil
}

// readBody reads a request's JSON body. A body sent with a Content-Type
// other than JSON is refused (a request without one is read as JSON).
func readBody(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, ledger.Errorf(CodeUnsupportedMediaType, "Content-Type %q: the body must be application/json", ct)
		}
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "read body: %v", err)
	}
	if err := checkBodySize(len(b)); err != nil {
		return nil, err
	}
	return b, nil
}

// keyIfAny returns the request's Idempotency-Key header, checked as
// the ledger stores it, or "" when it has none (opening an account).
func keyIfAny(r *http.Request) (string, error) {
	if r.Header.Get("Idempotency-Key") == "" && len(r.Header.Values("Idempotency-Key")) <= 1 {
		return "", nil
	}
	key, err := idempotencyKey(r)
	if err != nil {
		return "", err
	}
	return key, validKey(key)
}

// idempotencyKey returns the request's Idempotency-Key header, required on
// every request that moves money.
func idempotencyKey(r *http.Request) (string, error) {
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		return "", ledger.Errorf(ledger.CodeInvalidRequest, "give the Idempotency-Key header once")
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return "", ledger.Errorf(CodeIdempotencyKeyMissing, "%s %s requires an Idempotency-Key header", r.Method, r.URL.Path)
	}
	if len(key) > 255 {
		return "", ledger.Errorf(ledger.CodeInvalidRequest, "the Idempotency-Key is longer than 255 characters")
	}
	return key, nil
}

// validKey checks an Idempotency-Key as the ledger stores it, in the
// request's home region.
func validKey(key string) error {
	for _, r := range key {
		if r == ' ' {
			return ledger.Errorf(ledger.CodeInvalidRequest, "the Idempotency-Key must not contain spaces")
		}
	}
	return ledger.ValidIdempotencyKey(key)
}

// TransferRequest is the body of POST /v1/transfers.
type TransferRequest struct {
	From     string `json:"from"`
	To       string `json:"to"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// Hold authorizes only: the amount is reserved on the source until
	// the transfer is captured, voided or expires (at ExpiresAt; default
	// ledger.DefaultHoldExpiry after the request). The expiry is not part
	// of the request's identity: a retry is the same request.
	Hold      bool       `json:"hold,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Reference is the client's own ID of the transfer (an order or
	// payment ID): unique among its transfers from the source's region
	// that were not refused. Metadata is the client's, kept with the
	// transfer. Both are part of the request (ledger.ValidReference and
	// ledger.ValidMetadata give their limits).
	Reference string            `json:"reference,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
}

// command is the ledger command of the request, as transfer id of client's
// key, made at created: a hold expires when it asks, or
// ledger.DefaultHoldExpiry after created.
func (r TransferRequest) command(id, client, key string, created time.Time) ledger.Command {
	c := ledger.Command{Type: ledger.TypeTransfer, TransferID: id, ClientID: client, IdempotencyKey: key,
		From: r.From, To: r.To, Amount: r.Amount, Currency: r.Currency, CreatedAt: created, Hold: r.Hold,
		Reference: r.Reference, Metadata: r.Metadata}
	switch {
	case r.Hold && r.ExpiresAt != nil:
		c.ExpiresAt = r.ExpiresAt.UTC()
	case r.Hold:
		c.ExpiresAt = created.Add(ledger.DefaultHoldExpiry)
	}
	return c
}

// ActionRequest is the body of POST /v1/transfers/{id}/capture and
// /refunds: the amount (0 or absent: all of it). A void has no body, or an
// empty object.
type ActionRequest struct {
	Amount int64 `json:"amount,omitempty"`
}

// DecodeActionRequest parses the body of a capture, void or refund: empty,
// or an object with at most an amount (not for a void). It returns an
// *ledger.Error for any problem with it.
func DecodeActionRequest(op string, body []byte) (ActionRequest, error) {
	var r ActionRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return r, nil
	}
	fields := []string{"amount"}
	if op == ledger.TypeVoid {
		fields = nil
	}
	if err := decodeStrict(body, &r, fields...); err != nil {
		return r, err
	}
	if r.Amount < 0 {
		return r, ledger.Errorf(ledger.CodeInvalidAmount, "amount %d must be a positive number of minor units", r.Amount)
	}
	return r, nil
}

// actionFingerprint identifies a capture, void or refund request: which
// operation, of which transfer, and the amount asked for.
func actionFingerprint(op, of string, amount int64) []byte {
	b, _ := json.Marshal(struct {
		Op     string `json:"op"`
		Of     string `json:"of"`
		Amount int64  `json:"amount"`
	}{op, of, amount})
	h := sha256.Sum256(b)
	return h[:]
}

// AccountRequest is the body of POST /v1/accounts.
type AccountRequest struct {
	Currency string `json:"currency"`
	// Floor is the lowest balance allowed (0: no overdraft).
	Floor int64 `json:"floor"`
	// Region is the account's home region; default: the region asked.
	Region string `json:"region,omitempty"`
	// Reference is the client's own ID of the account, unique among its
	// accounts in the account's region; Metadata is the client's.
	Reference string            `json:"reference,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
}

// fingerprint identifies an account request behind an idempotency key:
// its currency, floor and region as the request gave them (no region is
// not the region it was sent to, so a retry sent to another region is the
// same request).
func (r AccountRequest) fingerprint() []byte {
	h := sha256.New()
	for _, s := range []string{"account", r.Currency, r.Region} {
		_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
		io.WriteString(h, s)
	}
	_ = binary.Write(h, binary.BigEndian, r.Floor)
	ledger.WriteLabels(h, r.Reference, r.Metadata)
	return h.Sum(nil)
}

// decodeStrict decodes one JSON object into v: unknown, case-folded or
// repeated fields and trailing data are refused, and an "amount" or
// "floor" must be a plain integer in int64 (fractions, exponents, strings
// and overflow are refused with invalid_amount).
func decodeStrict(body []byte, v any, fields ...string) error {
	if err := checkBodySize(len(body)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ledger.Errorf(ledger.CodeInvalidRequest, "the body must be a JSON object")
	}
	allowed := map[string]bool{}
	for _, f := range fields {
		allowed[f] = true
	}
	raw := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ledger.Errorf(ledger.CodeInvalidRequest, "malformed JSON: %v", err)
		}
		k, _ := t.(string)
		if !allowed[k] {
			return ledger.Errorf(ledger.CodeInvalidRequest, "unknown field %q", k)
		}
		if _, dup := raw[k]; dup {
			return ledger.Errorf(ledger.CodeInvalidRequest, "field %q given twice", k)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return ledger.Errorf(ledger.CodeInvalidRequest, "malformed JSON: %v", err)
		}
		raw[k] = v
	}
	if _, err := dec.Token(); err != nil {
		return ledger.Errorf(ledger.CodeInvalidRequest, "malformed JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ledger.Errorf(ledger.CodeInvalidRequest, "trailing data after the JSON object")
	}
	for _, f := range []string{"amount", "floor"} {
		v, ok := raw[f]
		if !ok {
			continue
		}
		if len(v) == 0 || v[0] == '"' || v[0] == 'n' || v[0] == 't' || v[0] == 'f' || v[0] == '[' || v[0] == '{' {
			return ledger.Errorf(ledger.CodeInvalidAmount, "%s must be a JSON integer, got %s", f, v)
		}
		if _, err := ledger.ParseAmount(string(v)); err != nil {
			return err
		}
	}
	// The JSON v2 decoder refuses what lies below the top level as the
	// loop above refuses it there: a metadata key given twice, invalid
	// UTF-8.
	if err := jsonv2.Unmarshal(body, v); err != nil {
		return ledger.Errorf(ledger.CodeInvalidRequest, "malformed JSON: %v", err)
	}
	return nil
}

// wireTransfer is a transfer request as the fast decoder reads it: the
// amount stays raw, to be checked as decodeStrict checks it.
type wireTransfer struct {
	From      string            `json:"from"`
	To        string            `json:"to"`
	Amount    jsontext.Value    `json:"amount"`
	Currency  string            `json:"currency"`
	Hold      bool              `json:"hold"`
	ExpiresAt *time.Time        `json:"expires_at"`
	Reference string            `json:"reference"`
	Metadata  map[string]string `json:"metadata"`
}

// decodeTransferFast decodes a well-formed transfer request in one pass
// (the JSON v2 decoder, as the ledger decodes commands: unknown,
// case-folded and repeated names, invalid UTF-8 and trailing data are
// errors by themselves), and reports false for anything else, which
// decodeStrict then decodes or refuses with its precise error. It never
// accepts what decodeStrict refuses (TestDecodeTransferFastAgrees).
func decodeTransferFast(body []byte) (TransferRequest, bool) {
	if len(body) > MaxBodyBytes {
		return TransferRequest{}, false
	}
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return TransferRequest{}, false
	}
	var w wireTransfer
	if jsonv2.Unmarshal(body, &w, jsonv2.RejectUnknownMembers(true)) != nil {
		return TransferRequest{}, false
	}
	r := TransferRequest{From: w.From, To: w.To, Currency: w.Currency, Hold: w.Hold, ExpiresAt: w.ExpiresAt,
		Reference: w.Reference, Metadata: w.Metadata}
	if len(w.Amount) > 0 {
		if w.Amount.Kind() != '0' {
			return TransferRequest{}, false
		}
		n, err := ledger.ParseAmount(string(w.Amount))
		if err != nil {
			return TransferRequest{}, false
		}
		r.Amount = n
	}
	return r, true
}

// DecodeTransferRequest parses and checks a POST /v1/transfers body. It
// returns an *ledger.Error for any problem with it.
func DecodeTransferRequest(body []byte) (TransferRequest, error) {
	r, ok := decodeTransferFast(body)
	if !ok { // the strict decoder names what is wrong, or decodes what the fast one would not
		if err := decodeStrict(body, &r, "from", "to", "amount", "currency", "hold", "expires_at", "reference", "metadata"); err != nil {
			return r, err
		}
	}
	if err := validLabels(r.Reference, r.Metadata); err != nil {
		return r, err
	}
	if r.ExpiresAt != nil && !r.Hold {
		return r, ledger.Errorf(ledger.CodeInvalidRequest, "expires_at belongs to a hold (\"hold\": true)")
	}
	switch {
	case r.Amount <= 0:
		return r, ledger.Errorf(ledger.CodeInvalidAmount, "amount %d must be a positive number of minor units", r.Amount)
	case !ledger.ValidCurrency(r.Currency):
		return r, ledger.Errorf(ledger.CodeInvalidCurrency, "currency %q is not an ISO 4217 currency code", r.Currency)
	case r.From == "" || r.To == "":
		return r, ledger.Errorf(ledger.CodeInvalidRequest, "from and to are required")
	case r.From == r.To:
		return r, ledger.Errorf(ledger.CodeSameAccount, "from and to are both %s", r.From)
	}
	return r, nil
}

// RequestFingerprint is the fingerprint of the transfer request behind a
// client's command, as the API stores it with the request's idempotency
// key: the ledger's apply transaction stores it for a key the API did not
// claim (ledger.Command.KeyExpiresAt).
func RequestFingerprint(c ledger.Command) []byte {
	switch c.Type {
	case ledger.TypeCapture, ledger.TypeVoid:
		return actionFingerprint(c.Type, c.TransferID, c.Amount)
	case ledger.TypeRefund:
		return actionFingerprint(c.Type, c.RefundOf, c.Amount)
	case ledger.TypeClose, ledger.TypeFreeze, ledger.TypeUnfreeze:
		return actionFingerprint(c.Type, c.From, 0)
	}
	return TransferRequest{From: c.From, To: c.To, Amount: c.Amount, Currency: c.Currency, Hold: c.Hold,
		Reference: c.Reference, Metadata: c.Metadata}.fingerprint()
}

// validLabels checks a request's reference (when given) and metadata, and
// refuses metadata given as an empty object: leave it out instead.
func validLabels(reference string, metadata map[string]string) error {
	if metadata != nil && len(metadata) == 0 {
		return ledger.Errorf(ledger.CodeInvalidRequest, "metadata is an empty object: leave it out instead")
	}
	return ledger.ValidLabels(reference, metadata)
}

// fingerprint identifies the request behind an idempotency key; a hold's
// expiry is not part of it.
func (r TransferRequest) fingerprint() []byte {
	r.ExpiresAt = nil
	b, _ := json.Marshal(r) // fixed field order
	h := sha256.Sum256(b)
	return h[:]
}

// TransferBody is the JSON form of a transfer.
type TransferBody struct {
	ID        string      `json:"id"`
	From      string      `json:"from"`
	To        string      `json:"to"`
	Amount    int64       `json:"amount"`
	Currency  string      `json:"currency"`
	Status    string      `json:"status"`
	Reason    ledger.Code `json:"reason,omitempty"`
	Version   int64       `json:"version"`
	CreatedAt time.Time   `json:"created_at"`
	// ExpiresAt marks a hold; CapturedAmount is what its capture moved.
	ExpiresAt      *time.Time `json:"expires_at,omitempty"`
	CapturedAmount *int64     `json:"captured_amount,omitempty"`
	// RefundOf names the transfer a refund gives money back for.
	RefundOf string `json:"refund_of,omitempty"`
	// Reference and Metadata are the client's, from the request.
	Reference string            `json:"reference,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// RefundedAmount and Refunds: the refunds of this transfer that have
	// reached its region (GET only).
	RefundedAmount *int64       `json:"refunded_amount,omitempty"`
	Refunds        []RefundBody `json:"refunds,omitempty"`
	Steps          []StepBody   `json:"steps,omitempty"`
}

// RefundBody is one refund of a transfer, as its region knows it.
type RefundBody struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

// StepBody is one change-log leg of a transfer in its home region.
type StepBody struct {
	Leg     string `json:"leg"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func transferBody(t ledger.Transfer) TransferBody {
	b := TransferBody{ID: t.ID, From: t.From, To: t.To, Amount: t.Amount, Currency: t.Currency, Status: string(t.Status),
		Reason: t.Reason, Version: t.Version, CreatedAt: t.CreatedAt.UTC(), RefundOf: t.RefundOf, Reference: t.Reference,
		Metadata: t.Metadata}
	if t.IsHold() {
		e := t.ExpiresAt.UTC()
		b.ExpiresAt = &e
		if t.CapturedAmount > 0 {
			n := t.CapturedAmount
			b.CapturedAmount = &n
		}
	}
	return b
}

// transferStatus is the HTTP status of a transfer's representation: 201
// once it reached a final state, 202 while it is moving.
func transferStatus(t ledger.Transfer) int {
	switch t.Status {
	case ledger.StatusCompleted, ledger.StatusRefunded, ledger.StatusHeld, ledger.StatusVoided, ledger.StatusExpired:
		return http.StatusCreated
	case ledger.StatusRejected:
		st, _ := problem(ledger.Errorf(t.Reason, ""))
		return st
	}
	return http.StatusAccepted
}

// Respond renders the response to a client request's result. The ledger
// stores it with the request's idempotency key in the transaction that
// applies the transfer (services/api/apidb.Answers).
func Respond(r ledger.Result) (int, []byte) {
	return RespondTo(ledger.Command{}, r)
}

// RespondTo renders the response to the result of the client request c: a
// capture or void is answered 200 with the transfer it moved on (202 while
// a captured amount is still on its way to another region), or with the
// problem that refused it; every other request as Respond.
func RespondTo(c ledger.Command, r ledger.Result) (int, []byte) {
	// A repeat of an action, after its key's answer expired, is answered
	// from the action's record: its refusal, or the hold it acted on.
	repeat := r.Kind == ledger.Duplicate && r.Action != nil
	switch {
	case c.IsAccountAction() && repeat && r.Action.Status == ledger.ActionRejected:
		return problem(ledger.Errorf(r.Action.Reason, "this %s of %s was refused: %s", r.Action.Type, r.Action.AccountID, r.Action.Reason))
	case c.IsAccountAction() && (r.Kind == ledger.Applied || repeat) && r.Account != nil:
		b, _ := json.Marshal(accountBody(*r.Account))
		return http.StatusOK, b
	case c.IsAction() && repeat && r.Action.Status == ledger.ActionRejected:
		return problem(ledger.Errorf(r.Action.Reason, "this %s of %s was refused: %s", r.Action.Type, r.Action.TransferID, r.Action.Reason))
	case c.IsAction() && (r.Kind == ledger.Applied || repeat && r.Transfer.ID != ""):
		b, _ := json.Marshal(transferBody(r.Transfer))
		if r.Transfer.Status == ledger.StatusDebited {
			return http.StatusAccepted, b
		}
		return http.StatusOK, b
	}
	switch {
	case r.Err != nil && (r.Kind == ledger.Rejected || r.Kind == ledger.Duplicate && r.Err.Code == r.Transfer.Reason):
		return problem(r.Err) // a repeat of a refusal for a reference in use names the transfer that holds it
	case r.Kind == ledger.Conflict || r.Kind == ledger.Invalid:
		return problem(r.Err)
	case r.Transfer.ID != "" && r.Transfer.Status == ledger.StatusRejected:
		return problem(ledger.Errorf(r.Transfer.Reason, "transfer %s was refused: %s", r.Transfer.ID, r.Transfer.Reason))
	}
	b, _ := json.Marshal(transferBody(r.Transfer))
	return transferStatus(r.Transfer), b
}

// AccountBody is the JSON form of an account.
type AccountBody struct {
	ID        string    `json:"id"`
	Currency  string    `json:"currency"`
	Balance   int64     `json:"balance"`
	Held      int64     `json:"held"`
	Available int64     `json:"available"`
	Floor     int64     `json:"floor"`
	Closed    bool      `json:"closed"`
	Frozen    bool      `json:"frozen"`
	Version   int64     `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	// Reference and Metadata are the client's, from the request that
	// opened the account.
	Reference string            `json:"reference,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
}

func accountBody(a ledger.Account) AccountBody {
	return AccountBody{ID: a.ID, Currency: a.Currency, Balance: a.Balance, Held: a.Held, Available: a.Available(), Floor: a.Floor, Closed: a.Closed,
		Frozen: a.Frozen, Version: a.Version, CreatedAt: a.CreatedAt.UTC(), Reference: a.Reference, Metadata: a.Metadata}
}

// EntriesBody is a page of an account's change-log.
type EntriesBody struct {
	Entries []EntryBody `json:"entries"`
	// NextAfter is the cursor of the next page; absent on the last page.
	NextAfter *int64 `json:"next_after,omitempty"`
}

// EntryBody is one change-log row.
type EntryBody struct {
	Version      int64     `json:"version"`
	TransferID   string    `json:"transfer_id"`
	Leg          string    `json:"leg"`
	Amount       int64     `json:"amount"`
	BalanceAfter int64     `json:"balance_after"`
	CreatedAt    time.Time `json:"created_at"`
}

func entryBody(p ledger.Posting) EntryBody {
	return EntryBody{Version: p.AccountVersion, TransferID: p.TransferID, Leg: string(p.Leg), Amount: p.Amount, BalanceAfter: p.BalanceAfter,
		CreatedAt: p.CreatedAt.UTC()}
}

// AccountAsOfBody is an account's balance at an instant (GET
// /v1/accounts/{id}?as_of=): the balance after its last change-log row
// written at or before AsOf, that row's version (0 before its first),
// what the account's open holds reserved then, and what was available.
type AccountAsOfBody struct {
	ID        string    `json:"id"`
	Currency  string    `json:"currency"`
	AsOf      time.Time `json:"as_of"`
	Balance   int64     `json:"balance"`
	Held      int64     `json:"held"`
	Available int64     `json:"available"`
	Version   int64     `json:"version"`
}

// StatementBody is an account's statement over [From, To) (GET
// /v1/accounts/{id}/statement): the balance before From and before To,
// and the change-log rows written in between, in version order, a page at
// a time; opening plus every row's amount is closing.
type StatementBody struct {
	Account        string      `json:"account"`
	Currency       string      `json:"currency"`
	From           time.Time   `json:"from"`
	To             time.Time   `json:"to"`
	OpeningBalance int64       `json:"opening_balance"`
	ClosingBalance int64       `json:"closing_balance"`
	Entries        []EntryBody `json:"entries"`
	// NextAfter is the cursor of the next page; absent on the last page.
	NextAfter *int64 `json:"next_after,omitempty"`
}

// parseInstant reads an RFC 3339 instant from query parameter name, at
// most now (a balance or a statement past now could still change).
func parseInstant(name, v string, now time.Time) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, ledger.Errorf(ledger.CodeInvalidRequest, "%s=%.40q is not an RFC 3339 time (2026-12-31T23:59:59Z)", name, v)
	}
	return t, checkInstant(name, t, now)
}

// checkInstant refuses an instant after now, or outside the years 1 to
// 9999 (UTC), which no answer could render.
func checkInstant(name string, t, now time.Time) error {
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s=%s is outside the years 1 to 9999 (UTC)", name, t.Format(time.RFC3339))
	}
	if t.After(now) {
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s=%s is in the future: what happens until then is not known yet", name, t.Format(time.RFC3339))
	}
	return nil
}
