package ledger

// Bugs switches deliberate bugs on. They exist only so that tests can show
// that their checks fail, and name the transfers, when a protection is
// missing: the fault-injection suite's (internal/lab/chaos, one bug per
// scenario). Nothing else sets them, and no flag or environment variable
// reaches them: the zero value is the correct ledger, router and API.
type Bugs struct {
	// AckBeforeCommit acks a batch's messages before its transaction
	// commits, so a crash between the two loses them.
	AckBeforeCommit bool
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
	// NoRetry gives up every store transaction on its first retryable
	// error (a deadlock, serialization failure, lock timeout, unique-key
	// race, lost connection or fenced claim) instead of retrying it.
	NoRetry bool
	// ForwardIgnoresPubAck makes the router ack a command in its route
	// stream once the forward to the home region was sent, whether or not
	// the home stream confirmed it: a forward lost on the way is lost.
	ForwardIgnoresPubAck bool
	// RelayIgnoresPubAck makes the router mark an outbox row sent once the
	// saga step was published, whether or not the destination stream
	// confirmed it: a step lost on the way leaves its money in transit.
	RelayIgnoresPubAck bool
}
