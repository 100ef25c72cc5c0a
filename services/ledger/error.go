package ledger

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable reason. The set is closed; the HTTP
// layer maps each code to a status in one place.
type Code string

// Reasons a command is refused or an operation fails.
const (
	// CodeInvalidRequest: the command is malformed (missing or bad fields).
	CodeInvalidRequest Code = "invalid_request"
	// CodeInvalidAmount: the amount is zero, negative, fractional, not an
	// integer or beyond int64.
	CodeInvalidAmount Code = "invalid_amount"
	// CodeInvalidCurrency: the currency is not an active ISO 4217 code.
	CodeInvalidCurrency Code = "invalid_currency"
	// CodeSameAccount: source and destination are the same account.
	CodeSameAccount Code = "same_account"
	// CodeAccountNotFound: an account named by the command does not exist.
	CodeAccountNotFound Code = "account_not_found"
	// CodeAccountClosed: an account named by the command is closed.
	CodeAccountClosed Code = "account_closed"
	// CodeSystemAccount: an account named as a client's source or
	// destination is one of the region's own (issuance, transit), which
	// only the ledger moves money into and out of.
	CodeSystemAccount Code = "system_account"
	// CodeCurrencyMismatch: the command's currency is not the account's.
	CodeCurrencyMismatch Code = "currency_mismatch"
	// CodeInsufficientFunds: the debit would take the source below its floor.
	CodeInsufficientFunds Code = "insufficient_funds"
	// CodeBalanceOverflow: the resulting balance would not fit in int64.
	CodeBalanceOverflow Code = "balance_overflow"
	// CodeWrongRegion: the command was delivered to a region that is not the
	// home region of its source account.
	CodeWrongRegion Code = "wrong_region"
	// CodeIdempotencyKeyReused: the key was already used for a different
	// request.
	CodeIdempotencyKeyReused Code = "idempotency_key_reused"
	// CodeTransferIDReused: the transfer ID already belongs to another
	// request.
	CodeTransferIDReused Code = "transfer_id_reused"
	// CodeIllegalTransition: the state machine does not allow the event in
	// the transfer's current status.
	CodeIllegalTransition Code = "illegal_transition"
	// CodeStaleVersion: a compare-and-set found a newer version than the one
	// the caller read.
	CodeStaleVersion Code = "stale_version"
	// CodeNotFound: the object asked for does not exist.
	CodeNotFound Code = "not_found"
	// CodeTransferNotHeld: a capture or void of a transfer that is not (or
	// no longer) an open hold: it was captured, voided or expired already,
	// or was never a hold.
	CodeTransferNotHeld Code = "transfer_not_held"
	// CodeHoldExpired: a capture after the hold's expiry.
	CodeHoldExpired Code = "hold_expired"
	// CodeAmountExceedsHold: a capture of more than the hold reserved.
	CodeAmountExceedsHold Code = "amount_exceeds_hold"
	// CodeTransferNotRefundable: a refund of a transfer that did not
	// complete (or is itself a refund).
	CodeTransferNotRefundable Code = "transfer_not_refundable"
	// CodeRefundExceedsCaptured: the refunds of a transfer would exceed
	// what it moved.
	CodeRefundExceedsCaptured Code = "refund_exceeds_captured"
	// CodeAccountFrozen: a debit of a frozen account, or a freeze of one.
	CodeAccountFrozen Code = "account_frozen"
	// CodeAccountNotFrozen: an unfreeze of an account that is not frozen.
	CodeAccountNotFrozen Code = "account_not_frozen"
	// CodeAccountNotEmpty: a close of an account whose balance is not zero,
	// that has open holds, or with money on its way out to another region.
	CodeAccountNotEmpty Code = "account_not_empty"
	// CodeReferenceInUse: the client's reference names another transfer
	// (or account) of this region already; Error.Existing names it.
	CodeReferenceInUse Code = "reference_in_use"
)

// Codes returns every Code, in the order they are declared.
func Codes() []Code {
	return []Code{CodeInvalidRequest, CodeInvalidAmount, CodeInvalidCurrency, CodeSameAccount, CodeAccountNotFound,
		CodeAccountClosed, CodeSystemAccount, CodeCurrencyMismatch, CodeInsufficientFunds, CodeBalanceOverflow, CodeWrongRegion,
		CodeIdempotencyKeyReused, CodeTransferIDReused, CodeIllegalTransition, CodeStaleVersion, CodeNotFound,
		CodeTransferNotHeld, CodeHoldExpired, CodeAmountExceedsHold, CodeTransferNotRefundable, CodeRefundExceedsCaptured,
		CodeAccountFrozen, CodeAccountNotFrozen, CodeAccountNotEmpty, CodeReferenceInUse}
}

// Error is a domain error with a stable code and a message safe to show to
// clients.
type Error struct {
	Code    Code
	Message string
	// Existing names, for CodeReferenceInUse, the transfer or account
	// that holds the reference.
	Existing string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, or "" when
// there is none (an internal error).
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
