package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/paymesh/paymesh/services/ledger"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 16 << 10

// TransferRequest is the body of POST /v1/transfers.
type TransferRequest struct {
	From     string `json:"from"`
	To       string `json:"to"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// AccountRequest is the body of POST /v1/accounts.
type AccountRequest struct {
	Currency string `json:"currency"`
	// Floor is the lowest balance allowed (0: no overdraft).
	Floor int64 `json:"floor"`
	// Region is the account's home region; default: the region asked.
	Region string `json:"region,omitempty"`
}

// decodeStrict decodes one JSON object into v: unknown, case-folded or
// repeated fields and trailing data are refused, and an "amount" or
// "floor" must be a plain integer in int64 (fractions, exponents, strings
// and overflow are refused with invalid_amount).
func decodeStrict(body []byte, v any, fields ...string) error {
	if len(body) > MaxBodyBytes {
		return ledger.Errorf(CodeBodyTooLarge, "body is %d bytes, over the %d-byte limit", len(body), MaxBodyBytes)
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
	if err := json.Unmarshal(body, v); err != nil {
		return ledger.Errorf(ledger.CodeInvalidRequest, "malformed JSON: %v", err)
	}
	return nil
}

// wireTransfer is a transfer request as the fast decoder reads it: the
// amount stays raw, to be checked as decodeStrict checks it.
type wireTransfer struct {
	From     string         `json:"from"`
	To       string         `json:"to"`
	Amount   jsontext.Value `json:"amount"`
	Currency string         `json:"currency"`
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
	r := TransferRequest{From: w.From, To: w.To, Currency: w.Currency}
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
		if err := decodeStrict(body, &r, "from", "to", "amount", "currency"); err != nil {
			return r, err
		}
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
	return TransferRequest{From: c.From, To: c.To, Amount: c.Amount, Currency: c.Currency}.fingerprint()
}

// fingerprint identifies the request behind an idempotency key.
func (r TransferRequest) fingerprint() []byte {
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
	Steps     []StepBody  `json:"steps,omitempty"`
}

// StepBody is one change-log leg of a transfer in its home region.
type StepBody struct {
	Leg     string `json:"leg"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func transferBody(t ledger.Transfer) TransferBody {
	return TransferBody{ID: t.ID, From: t.From, To: t.To, Amount: t.Amount, Currency: t.Currency, Status: string(t.Status),
		Reason: t.Reason, Version: t.Version, CreatedAt: t.CreatedAt.UTC()}
}

// transferStatus is the HTTP status of a transfer's representation: 201
// once it reached a final state, 202 while it is moving.
func transferStatus(t ledger.Transfer) int {
	switch t.Status {
	case ledger.StatusCompleted, ledger.StatusRefunded:
		return http.StatusCreated
	case ledger.StatusRejected:
		st, _ := problem(ledger.Errorf(t.Reason, ""))
		return st
	}
	return http.StatusAccepted
}

// Respond renders the response to a client request's result. The ledger
// stores it with the request's idempotency key in the transaction that
// applies the transfer (services/api/postgres.Answers).
func Respond(r ledger.Result) (int, []byte) {
	switch {
	case r.Kind == ledger.Rejected && r.Err != nil:
		return problem(r.Err)
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
	Floor     int64     `json:"floor"`
	Closed    bool      `json:"closed"`
	Version   int64     `json:"version"`
	CreatedAt time.Time `json:"created_at"`
}

func accountBody(a ledger.Account) AccountBody {
	return AccountBody{ID: a.ID, Currency: a.Currency, Balance: a.Balance, Floor: a.Floor, Closed: a.Closed,
		Version: a.Version, CreatedAt: a.CreatedAt.UTC()}
}

// EntriesBody is a page of an account's change-log.
type EntriesBody struct {
	Entries []EntryBody `json:"entries"`
	// NextAfter is the cursor of the next page; absent on the last page.
	NextAfter *int64 `json:"next_after,omitempty"`
}

// EntryBody is one change-log row.
type EntryBody struct {
	Version      int64  `json:"version"`
	TransferID   string `json:"transfer_id"`
	Leg          string `json:"leg"`
	Amount       int64  `json:"amount"`
	BalanceAfter int64  `json:"balance_after"`
}
