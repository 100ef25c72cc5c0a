package telemetry

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	ljs "github.com/paymesh/paymesh/services/ledger/jetstream"
	"github.com/paymesh/paymesh/services/router"
)

// Pending counts the messages of a stream that its consumers have not
// finished with; it returns an error when the stream cannot be read.
type Pending func(ctx context.Context) (int64, error)

// ObserveBacklog exports, at each scrape, the messages pending on a
// region's stream as paymesh_consumer_pending{region, stream}: consumer
// lag. A scrape at which pending fails leaves the series out, so a stale
// value is never shown as current. It returns an error when the gauge
// cannot be registered.
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

// LedgerPending returns the backlog of a region's ledger stream over all
// its shard consumers (ljs.Backlog).
func LedgerPending(js jetstream.JetStream, t ljs.Topology) Pending {
	return func(ctx context.Context) (int64, error) {
		n, err := ljs.Backlog(ctx, js, t)
		if err != nil {
			return 0, fmt.Errorf("ledger backlog %s: %w", t.Stream(), err)
		}
		return int64(n), nil
	}
}

// RoutePending returns the backlog of a region's route stream: a work
// queue, so every message still in it is not forwarded yet.
func RoutePending(js jetstream.JetStream, region string) Pending {
	return func(ctx context.Context) (int64, error) {
		s, err := js.Stream(ctx, router.Stream(region))
		if err != nil {
			return 0, fmt.Errorf("route backlog %s: %w", router.Stream(region), err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("route backlog %s: %w", router.Stream(region), err)
		}
		return int64(info.State.Msgs), nil
	}
}
