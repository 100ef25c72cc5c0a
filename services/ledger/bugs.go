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
	// IgnoreKeyBody makes the store's BeginKey skip its comparison of
	// request fingerprints: an answered idempotency key sent again with
	// another body is replayed the first request's stored response
	// instead of refused. (A key still in flight gets its 409, and one
	// taken over or expired still meets the transfer's own fingerprint.)
	IgnoreKeyBody bool
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
