package ledger

// Bugs switches deliberate bugs on. They exist only so that the tests of the
// fault-injection suite (internal/chaos) can show that its checker fails,
// and names the transfers, when a protection is missing. Nothing else sets
// them, and no flag or environment variable reaches them: the zero value is
// the correct ledger.
type Bugs struct {
	// AckBeforeCommit acks a batch's messages before its transaction
	// commits, so a crash between the two loses them.
	AckBeforeCommit bool
	// DedupByTransferID keys the consume-log by transfer ID instead of the
	// client's idempotency key and skips the business-key lookup, so a
	// request sent again under a new transfer ID applies again (once the
	// schema's unique business key is gone as well).
	DedupByTransferID bool
	// ForgetKeyTransfer makes the store's TransferByKey find nothing, so
	// the API no longer answers a request repeated after its idempotency
	// key expired with the transfer the key made: it submits it again
	// under a new transfer ID.
	ForgetKeyTransfer bool
	// SkipOwnerCheck makes the API's POST /v1/transfers skip its check
	// that the source account belongs to the authenticated client (a BOLA
	// hole: any client could move another client's money). services/api
	// reads it from api.Config.Bugs.
	SkipOwnerCheck bool
}
