package ledger

// Bugs switches deliberate bugs on. They exist only so that tests can show
// that their checks fail, and name the transfers, when a protection is
// missing: the fault-injection suite's (internal/lab/chaos, one bug per
// scenario) and the store's out-of-order saga test (DropStateCAS). Nothing
// else sets them, and no flag or environment variable reaches them: the
// zero value is the correct ledger, router and API.
type Bugs struct {
	// DedupByTransferID keys the consume-log by transfer ID instead of the
	// client's idempotency key and skips the business-key lookup, so a
	// request sent again under a new transfer ID applies again (once the
	// schema's unique business key is gone as well).
	DedupByTransferID bool
	// SeenBeforeCommit records a batch's message keys in the recent-commit
	// cache when they are claimed, before the transaction commits (the
	// "SETNX before processing" mistake). A redelivery, or the next
	// attempt, of a batch whose transaction then fails is taken for a
	// duplicate and acked: the transfer is lost.
	SeenBeforeCommit bool
	// AssumeCommitted takes a COMMIT the server never answered for a
	// success, without reading the consume-log back: a batch cut off
	// before its COMMIT reached the server is acked, and lost.
	AssumeCommitted bool
	// DropStateCAS lets a saga step move a transfer whatever its status:
	// the state machine's transition check and the compare-and-set on
	// (status, version) are gone, so a refusal that arrives after the
	// confirmation refunds a completed transfer.
	DropStateCAS bool
}
