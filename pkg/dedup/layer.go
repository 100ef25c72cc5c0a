package dedup

// Layer names which of the consume-log's two layers answered a Duplicate or
// Conflict claim. The values are the metric label values of the ledger's
// layers of the same names (services/ledger's LayerRecentCache and
// LayerConsumeLog), which map them one to one.
type Layer string

// The consume-log's layers, outermost first.
const (
	// LayerCache is the in-memory cache of recently committed keys (Cache).
	LayerCache Layer = "recent_cache"
	// LayerTable is the consume-log row (the dedup_log table), claimed in
	// the caller's transaction.
	LayerTable Layer = "dedup_table"
)
