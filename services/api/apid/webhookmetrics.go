package apid

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/webhooks/delivery"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// ObserveWebhooks exports a region's webhook delivery, by endpoint:
// attempts by outcome (delivered, failed: an attempt to try again,
// gave_up: a delivery that failed for good), retries, the latency from an
// event's queueing to its 2xx, and each endpoint's backlog (its pending
// deliveries and the oldest one's age, read at each scrape). It sets
// st.Latency, so call it before the worker runs.
func ObserveWebhooks(m *telemetry.Metrics, region string, st *delivery.Stats, backlogs func(context.Context) ([]webhookdb.Backlog, error)) error {
	with := func(endpoint string, kv ...string) metric.MeasurementOption {
		attrs := []attribute.KeyValue{attribute.String("region", region), attribute.String("endpoint", endpoint)}
		for i := 0; i+1 < len(kv); i += 2 {
			attrs = append(attrs, attribute.String(kv[i], kv[i+1]))
		}
		return metric.WithAttributes(attrs...)
	}
	err := m.ObserveCounters("paymesh/webhooks", telemetry.Counter{Name: "paymesh.webhook.attempts",
		Help: "Webhook delivery attempts sent from this region, by endpoint and outcome: delivered (2xx), failed (tried again later), gave_up (the delivery failed for good).",
		Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
			st.Endpoints(func(id string, e *delivery.EndpointCounts) {
				o.ObserveInt64(c, e.Delivered.Load(), with(id, "outcome", "delivered"))
				o.ObserveInt64(c, e.Failures.Load()-e.GaveUp.Load(), with(id, "outcome", "failed"))
				o.ObserveInt64(c, e.GaveUp.Load(), with(id, "outcome", "gave_up"))
			})
		}},
		telemetry.Counter{Name: "paymesh.webhook.retries",
			Help: "Attempts after a delivery's first, by endpoint: each may deliver an event its receiver has already applied (a timeout after its commit), a duplicate it must recognise by the event's ID.",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				st.Endpoints(func(id string, e *delivery.EndpointCounts) { o.ObserveInt64(c, e.Retries.Load(), with(id)) })
			}})
	if err != nil {
		return err
	}
	meter := m.Meter("paymesh/webhooks")
	latency, err := meter.Float64Histogram("paymesh.webhook.delivery.latency.seconds",
		metric.WithDescription("Time from an event's queueing for an endpoint to its 2xx, retries included."),
		metric.WithExplicitBucketBoundaries(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600))
	if err != nil {
		return fmt.Errorf("webhook metrics: %w", err)
	}
	st.Latency = func(endpoint string, d time.Duration) {
		latency.Record(context.Background(), d.Seconds(), with(endpoint))
	}
	pending, err := meter.Int64ObservableGauge("paymesh.webhook.backlog", metric.WithDescription("Deliveries pending for an endpoint in this region."))
	if err != nil {
		return fmt.Errorf("webhook metrics: %w", err)
	}
	oldest, err := meter.Float64ObservableGauge("paymesh.webhook.backlog.oldest.seconds",
		metric.WithDescription("How long the endpoint's oldest pending delivery in this region has waited."))
	if err != nil {
		return fmt.Errorf("webhook metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		bs, err := backlogs(ctx)
		if err != nil {
			return nil // a scrape that cannot read them leaves the series out
		}
		for _, b := range bs {
			o.ObserveInt64(pending, b.Pending, with(b.Endpoint))
			o.ObserveFloat64(oldest, b.Oldest.Seconds(), with(b.Endpoint))
		}
		return nil
	}, pending, oldest)
	if err != nil {
		return fmt.Errorf("webhook metrics: %w", err)
	}
	return nil
}
