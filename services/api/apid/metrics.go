package apid

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// ObserveAPI exports the API's counters: its idempotency outcomes (st's
// replays by topic, Mismatches and InFlight), the duplicates the HTTP
// layer (ledger.LayerIdempotencyKey) caught, and their denominator, the
// requests that carried an Idempotency-Key into the key's checks, by topic
// (paymesh_api_keyed_requests_total); the forwarded calls it refused, by
// reason (api.Refusals); and the panics it recovered, by site
// (api.PanicSites).
func ObserveAPI(m *telemetry.Metrics, region string, st *api.Stats) error {
	layer := attribute.String("layer", string(ledger.LayerIdempotencyKey))
	at := func(outcome string, kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append([]attribute.KeyValue{attribute.String("region", region), attribute.String("outcome", outcome), layer}, kv...)...)
	}
	with := func(k, v string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String(k, v))
	}
	return m.ObserveCounters("paymesh/api", telemetry.Counter{Name: "paymesh.idempotency.keys",
		Help: "Repeated Idempotency-Keys: replays (by topic; each a client's retry), reuse with another body (422), repeats in flight (409).",
		Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
			for _, t := range keyedTopics {
				_, replayed := st.Keyed(t)
				o.ObserveInt64(c, replayed, at("replay", attribute.String("topic", t.String()), attribute.String("cause", string(ledger.CauseClientRetry))))
			}
			// One set of label names for the family: no topic or cause.
			o.ObserveInt64(c, st.Mismatches.Load(), at("mismatch", attribute.String("topic", ""), attribute.String("cause", "")))
			o.ObserveInt64(c, st.InFlight.Load(), at("in_flight", attribute.String("topic", ""), attribute.String("cause", "")))
		}},
		telemetry.Counter{Name: "paymesh.api.keyed.requests",
			Help: "Requests that carried an Idempotency-Key into the key's checks, by topic: the denominator of the Idempotency-Key layer's duplicate rate.",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				for _, t := range keyedTopics {
					keyed, _ := st.Keyed(t)
					o.ObserveInt64(c, keyed, metric.WithAttributes(attribute.String("region", region), attribute.String("topic", t.String()), layer))
				}
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

// keyedTopics are the topics of the requests that take an
// Idempotency-Key through the key's checks: a transfer (or hold), a
// capture, a void, a refund, an account's close, freeze or unfreeze.
var keyedTopics = []ledger.Topic{ledger.TopicTransfer, ledger.TopicCapture, ledger.TopicVoid, ledger.TopicRefundRequest, ledger.TopicAccount}

// ObserveAccounts exports the account ID collisions of the accounts this
// API opens (st's AccountIDCollisions, services/ledger/postgres's
// CreateAccount).
func ObserveAccounts(m *telemetry.Metrics, region string, st *ledger.Stats) error {
	return m.ObserveCounters("paymesh/api", telemetry.Single("paymesh.account.id.collisions",
		"IDs minted for a new account that another account already had (a node's clock stepped back): each refused and another minted.",
		st.AccountIDCollisions.Load, metric.WithAttributes(attribute.String("region", region))))
}
