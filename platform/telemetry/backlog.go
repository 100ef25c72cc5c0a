package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Pending counts the messages of a stream that its consumers have not
// finished with; it returns an error when the stream cannot be read.
type Pending func(ctx context.Context) (int64, error)

// ObserveBacklog exports, at each scrape, the messages pending on a
// region's stream as paymesh_consumer_pending{region, stream}: consumer
// lag. A scrape at which pending fails leaves the series out, so a stale
// value is never shown as current. It returns an error when the gauge
// cannot be registered. The services say how to count their streams
// (ledgerd.Pending, routerd.Pending).
func (m *Metrics) ObserveBacklog(region, stream string, pending Pending) error {
	meter := m.provider.Meter("paymesh/streams")
	g, err := meter.Int64ObservableGauge("paymesh.consumer.pending",
		metric.WithDescription("Messages of the stream its consumers have not acked yet: not delivered, or delivered and unacked."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	set := metric.WithAttributes(attribute.String("region", region), attribute.String("stream", stream))
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if n, err := pending(ctx); err == nil {
			o.ObserveInt64(g, n, set)
		}
		return nil
	}, g)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	return nil
}
