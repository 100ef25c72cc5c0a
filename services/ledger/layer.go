package ledger

// Layer names the defence that caught a duplicate. paymesh counts every
// caught duplicate by its layer (the "layer" label of paymesh_duplicates
// and of the API's and routers' counters), outermost first. The values are
// metric label values: dashboards and alert rules use them.
type Layer string

// The six layers of exactly-once, outermost first, and where each lives.
const (
	// LayerIdempotencyKey is the HTTP Idempotency-Key replay (services/api).
	LayerIdempotencyKey Layer = "idempotency_key"
	// LayerMsgID is the Nats-Msg-Id duplicate window of the route and
	// ledger streams (JetStream; services/router, services/ledger/ledgerstream).
	LayerMsgID Layer = "msg_id"
	// LayerRecentCache is the consume-log's in-memory cache of recently
	// committed keys (pkg/dedup's Cache).
	LayerRecentCache Layer = "recent_cache"
	// LayerConsumeLog is the consume-log row claimed in the apply
	// transaction (pkg/dedup's table, dedup_log).
	LayerConsumeLog Layer = "dedup_table"
	// LayerBusinessKey is a business unique key: a transfer per client and
	// idempotency key, a credit per transfer (services/ledger/postgres).
	LayerBusinessKey Layer = "business_key"
	// LayerStateCAS is the transfer state machine (Next) and its
	// compare-and-set on (status, version).
	LayerStateCAS Layer = "state_cas"
)

// Layers lists every layer, outermost first.
var Layers = []Layer{LayerIdempotencyKey, LayerMsgID, LayerRecentCache, LayerConsumeLog, LayerBusinessKey, LayerStateCAS}
