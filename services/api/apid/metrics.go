package apid

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// ObserveAPI exports the API's idempotency outcomes (st's Replays,
// Mismatches and InFlight): the duplicates the HTTP layer
// (ledger.LayerIdempotencyKey) caught, all of the transfer topic, the only
// request that takes an Idempotency-Key.
func ObserveAPI(m *telemetry.Metrics, region string, st *api.Stats) error {
	at := func(outcome string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String("outcome", outcome),
			attribute.String("layer", string(ledger.LayerIdempotencyKey)), attribute.String("topic", ledger.TopicTransfer.String()))
	}
	return m.ObserveCounters("paymesh/api", telemetry.Counter{Name: "paymesh.idempotency.keys",
		Help: "Repeated Idempotency-Keys: replays, reuse with another body (422), repeats in flight (409).",
		Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Replays.Load(), at("replay"))
			o.ObserveInt64(c, st.Mismatches.Load(), at("mismatch"))
			o.ObserveInt64(c, st.InFlight.Load(), at("in_flight"))
		}})
}
