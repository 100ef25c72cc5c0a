package receiverd

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/receiver"
)

// observe exports the receiver's counts: deliveries by outcome,
// duplicates by cause, refusals by reason, and the lasting gaps.
func (s *Server) observe(m *telemetry.Metrics) error {
	st := s.recv.Stats()
	with := func(k, v string) metric.MeasurementOption { return metric.WithAttributes(attribute.String(k, v)) }
	err := m.ObserveCounters("paymesh/receiver",
		telemetry.Counter{Name: "paymesh.receiver.events",
			Help: "Events the webhook receiver took, by outcome: applied (released: applied after waiting parked), parked (waiting for an earlier event).",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				o.ObserveInt64(c, st.Applied.Load()-st.Released.Load(), with("outcome", "applied"))
				o.ObserveInt64(c, st.Released.Load(), with("outcome", "released"))
				o.ObserveInt64(c, st.Parked.Load(), with("outcome", "parked"))
			}},
		telemetry.Counter{Name: "paymesh.receiver.duplicates",
			Help: "Deliveries of events the receiver had received before, by cause (retry, redelivery, parked, stale, unknown): nothing applied.",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				for _, k := range receiver.Causes() {
					o.ObserveInt64(c, st.Duplicates(k), with("cause", string(k)))
				}
			}},
		telemetry.Counter{Name: "paymesh.receiver.refused",
			Help: "Deliveries refused, by reason (signature, timestamp: outside the tolerance window, body).",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				for _, r := range receiver.Refusals() {
					o.ObserveInt64(c, st.Refused(r), with("reason", string(r)))
				}
			}})
	if err != nil {
		return err
	}
	_, err = m.Meter("paymesh/receiver").Int64ObservableGauge("paymesh.receiver.gaps",
		metric.WithDescription("Accounts whose parked events have waited past the gap timeout for an earlier event."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(s.gaps.Load())
			return nil
		}))
	if err != nil {
		return fmt.Errorf("receiver metrics: %w", err)
	}
	return nil
}
