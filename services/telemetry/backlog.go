package telemetry

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
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
// its shard consumers (ledgerstream.Backlog).
func LedgerPending(js jetstream.JetStream, t ledgerstream.Topology) Pending {
	return func(ctx context.Context) (int64, error) {
		n, err := ledgerstream.Backlog(ctx, js, t)
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

// ObserveDeadLetters exports, at each scrape, a region's dead letters by
// reason as paymesh_dlq_depth{region, reason} and the age of the oldest of
// each reason as paymesh_dlq_oldest_seconds{region, reason}. A reason
// whose dead letters are gone reports a depth of 0 and no age; when the
// dead letters are not known, both are left out. It returns an error when
// the gauges cannot be registered. The census is read, not refreshed: a
// scrape makes no round trip (the caller runs census.Run).
func (m *Metrics) ObserveDeadLetters(region string, census *dlq.Census) error {
	meter := m.provider.Meter("paymesh/streams")
	depth, err := meter.Int64ObservableGauge("paymesh.dlq.depth",
		metric.WithDescription("Dead letters held in the region's dead-letter stream, by reason."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	oldest, err := meter.Float64ObservableGauge("paymesh.dlq.oldest.seconds",
		metric.WithDescription("Age of the oldest dead letter held, by reason, since it was dead-lettered."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ds, ok := census.Depths()
		if !ok {
			return nil
		}
		now := time.Now()
		for _, d := range ds {
			set := metric.WithAttributes(attribute.String("region", region), attribute.String("reason", d.Reason))
			o.ObserveInt64(depth, d.Count, set)
			if d.Count > 0 && !d.Oldest.IsZero() {
				o.ObserveFloat64(oldest, max(now.Sub(d.Oldest).Seconds(), 0), set)
			}
		}
		return nil
	}, depth, oldest)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	return nil
}
