package apid

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// ObserveAPI exports the API's counters: its idempotency outcomes (st's
// Replays, Mismatches and InFlight), the duplicates the HTTP layer
// (ledger.LayerIdempotencyKey) caught, all of the transfer topic, the only
// request that takes an Idempotency-Key; the forwarded calls it refused,
// by reason (api.Refusals); and the panics it recovered, by site
// (api.PanicSites).
func ObserveAPI(m *telemetry.Metrics, region string, st *api.Stats) error {
	at := func(outcome string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String("outcome", outcome),
			attribute.String("layer", string(ledger.LayerIdempotencyKey)), attribute.String("topic", ledger.TopicTransfer.String()))
	}
	with := func(k, v string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String(k, v))
	}
	return m.ObserveCounters("paymesh/api", telemetry.Counter{Name: "paymesh.idempotency.keys",
		Help: "Repeated Idempotency-Keys: replays, reuse with another body (422), repeats in flight (409).",
		Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Replays.Load(), at("replay"))
			o.ObserveInt64(c, st.Mismatches.Load(), at("mismatch"))
			o.ObserveInt64(c, st.InFlight.Load(), at("in_flight"))
		}},
		telemetry.Counter{Name: "paymesh.forwarded.calls.refused",
			Help: "Calls forwarded from another region refused before they ran (4xx), by reason: what the sending region's HTTP edge would not have let through, or a call for another region.",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				for _, r := range api.Refusals {
					o.ObserveInt64(c, st.Refused(r), with("reason", r.String()))
				}
			}},
		telemetry.Counter{Name: "paymesh.api.panics",
			Help: "Panics recovered while serving, by site (an HTTP request, a forwarded call): each answered 500 internal, the process lives on.",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				for _, p := range api.PanicSites {
					o.ObserveInt64(c, st.Panics(p), with("site", p.String()))
				}
			}})
}

// ObserveAccounts exports the account ID collisions of the accounts this
// API opens (st's AccountIDCollisions, services/ledger/postgres's
// CreateAccount).
func ObserveAccounts(m *telemetry.Metrics, region string, st *ledger.Stats) error {
	return m.ObserveCounters("paymesh/api", telemetry.Single("paymesh.account.id.collisions",
		"IDs minted for a new account that another account already had (a node's clock stepped back): each refused and another minted.",
		st.AccountIDCollisions.Load, metric.WithAttributes(attribute.String("region", region))))
}
