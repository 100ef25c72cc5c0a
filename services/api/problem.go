package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/paymesh/paymesh/services/ledger"
)

// API-only error codes, next to the ledger's.
const (
	CodeUnauthorized           ledger.Code = "unauthorized"
	CodeRateLimited            ledger.Code = "rate_limited"
	CodeIdempotencyKeyMissing  ledger.Code = "idempotency_key_missing"
	CodeIdempotencyKeyInFlight ledger.Code = "idempotency_key_in_flight"
	CodeBodyTooLarge           ledger.Code = "body_too_large"
	CodeUnsupportedMediaType   ledger.Code = "unsupported_media_type"
	CodeRegionUnavailable      ledger.Code = "region_unavailable"
	CodeInternal               ledger.Code = "internal"
	// CodeOperatorOnly: a client's key on an operator endpoint.
	CodeOperatorOnly ledger.Code = "operator_only"
	// CodeClientOnly: an operator's key on a client endpoint.
	CodeClientOnly ledger.Code = "client_only"
	// CodeOperatorAPIDisabled: the API was started without the region's
	// operator NATS user, so it cannot reach the dead letters.
	CodeOperatorAPIDisabled ledger.Code = "operator_api_disabled"
	// CodeDeadLetterNotFound: no such dead letter, and no operator acted
	// on that sequence.
	CodeDeadLetterNotFound ledger.Code = "dead_letter_not_found"
	// CodeDeadLetterNotCommand: the dead letter's payload is not a
	// command; it cannot be replayed, only discarded.
	CodeDeadLetterNotCommand ledger.Code = "dead_letter_not_a_command"
	// CodeReplayUnsettled: the ledger did not settle a replay in time;
	// replaying again is safe.
	CodeReplayUnsettled ledger.Code = "replay_unsettled"
)

// statusOf is the one place where error codes meet HTTP statuses. Every
// code the API can answer is here; the OpenAPI test checks the document
// against this table.
var statusOf = map[ledger.Code]int{
	ledger.CodeInvalidRequest:        http.StatusBadRequest,
	ledger.CodeInvalidAmount:         http.StatusUnprocessableEntity,
	ledger.CodeInvalidCurrency:       http.StatusUnprocessableEntity,
	ledger.CodeSameAccount:           http.StatusUnprocessableEntity,
	ledger.CodeAccountNotFound:       http.StatusNotFound,
	ledger.CodeAccountClosed:         http.StatusUnprocessableEntity,
	ledger.CodeSystemAccount:         http.StatusUnprocessableEntity,
	ledger.CodeCurrencyMismatch:      http.StatusUnprocessableEntity,
	ledger.CodeInsufficientFunds:     http.StatusUnprocessableEntity,
	ledger.CodeBalanceOverflow:       http.StatusUnprocessableEntity,
	ledger.CodeIdempotencyKeyReused:  http.StatusUnprocessableEntity,
	ledger.CodeTransferIDReused:      http.StatusUnprocessableEntity,
	ledger.CodeNotFound:              http.StatusNotFound,
	ledger.CodeTransferNotHeld:       http.StatusConflict,
	ledger.CodeHoldExpired:           http.StatusConflict,
	ledger.CodeAmountExceedsHold:     http.StatusUnprocessableEntity,
	ledger.CodeTransferNotRefundable: http.StatusConflict,
	ledger.CodeRefundExceedsCaptured: http.StatusUnprocessableEntity,
	ledger.CodeAccountFrozen:         http.StatusUnprocessableEntity,
	ledger.CodeAccountNotFrozen:      http.StatusConflict,
	ledger.CodeAccountNotEmpty:       http.StatusConflict,
	ledger.CodeReferenceInUse:        http.StatusConflict,
	CodeUnauthorized:                 http.StatusUnauthorized,
	CodeRateLimited:                  http.StatusTooManyRequests,
	CodeIdempotencyKeyMissing:        http.StatusBadRequest,
	CodeIdempotencyKeyInFlight:       http.StatusConflict,
	CodeBodyTooLarge:                 http.StatusRequestEntityTooLarge,
	CodeUnsupportedMediaType:         http.StatusUnsupportedMediaType,
	CodeRegionUnavailable:            http.StatusServiceUnavailable,
	CodeInternal:                     http.StatusInternalServerError,
	CodeOperatorOnly:                 http.StatusForbidden,
	CodeClientOnly:                   http.StatusForbidden,
	CodeOperatorAPIDisabled:          http.StatusServiceUnavailable,
	CodeDeadLetterNotFound:           http.StatusNotFound,
	CodeDeadLetterNotCommand:         http.StatusUnprocessableEntity,
	CodeReplayUnsettled:              http.StatusServiceUnavailable,
	CodeWebhooksDisabled:             http.StatusServiceUnavailable,
}

// Codes lists every error code the API answers with.
func Codes() []ledger.Code {
	out := make([]ledger.Code, 0, len(statusOf))
	for c := range statusOf {
		out = append(out, c)
	}
	return out
}

// Problem is an RFC 9457 problem detail with paymesh's stable code.
type Problem struct {
	Type   string      `json:"type"`
	Title  string      `json:"title"`
	Status int         `json:"status"`
	Detail string      `json:"detail,omitempty"`
	Code   ledger.Code `json:"code"`
	// Existing names, for reference_in_use, the transfer or account that
	// holds the reference.
	Existing string `json:"existing,omitempty"`
}

// problem renders err as a problem response. Errors without a code are
// internal: the client sees a generic message only.
func problem(err error) (int, []byte) {
	code := ledger.ErrorCode(err)
	detail, existing := "", ""
	if code == "" {
		code = CodeInternal
		detail = "internal error"
	} else {
		var e *ledger.Error
		if errors.As(err, &e) {
			detail, existing = e.Message, e.Existing
		}
	}
	status, ok := statusOf[code]
	if !ok {
		status = http.StatusUnprocessableEntity
	}
	b, _ := json.Marshal(Problem{Type: "https://paymesh.dev/problems/" + string(code), Title: http.StatusText(status),
		Status: status, Detail: detail, Code: code, Existing: existing})
	return status, b
}
