package dedup

// Layer names the defence that caught a duplicate. paymesh counts every caught
// duplicate by its layer, outermost first.
type Layer string

// The six dedup layers, outermost first.
const (
	// LayerIdempotencyKey is the HTTP Idempotency-Key replay.
	LayerIdempotencyKey Layer = "idempotency_key"
	// LayerMsgID is JetStream's Nats-Msg-Id duplicate window.
	LayerMsgID Layer = "msg_id"
	// LayerCache is the in-memory cache of recently committed keys.
	LayerCache Layer = "recent_cache"
	// LayerTable is the consume-log row claimed in the business transaction.
	LayerTable Layer = "dedup_table"
	// LayerBusinessKey is a business unique key (transfer per client and
	// idempotency key, change-log per transfer and leg).
	LayerBusinessKey Layer = "business_key"
	// LayerStateCAS is the state machine's compare-and-set on (status, version).
	LayerStateCAS Layer = "state_cas"
)

// Layers lists every layer, outermost first.
var Layers = []Layer{LayerIdempotencyKey, LayerMsgID, LayerCache, LayerTable, LayerBusinessKey, LayerStateCAS}
