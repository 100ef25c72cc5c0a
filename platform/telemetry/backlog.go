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

// Fill is how full a stream is: what it holds, and the bounds at which it
// refuses publishes.
type Fill struct {
	Msgs, Bytes       int64
	MaxMsgs, MaxBytes int64
}

// ReadFill reads a stream's Fill; it returns an error when the stream
// cannot be read.
type ReadFill func(ctx context.Context) (Fill, error)

// ObserveFill exports, at each scrape, how full a region's stream is:
// paymesh_stream_messages and paymesh_stream_bytes against
// paymesh_stream_max_messages and paymesh_stream_max_bytes, each labelled
// {region, stream}. A scrape at which read fails leaves the series out. It
// returns an error when a gauge cannot be registered. The service that owns
// a stream exports it (ledgerstream.FillOf reads one).
func (m *Metrics) ObserveFill(region, stream string, read ReadFill) error {
	meter := m.provider.Meter("paymesh/streams")
	var gauges [4]metric.Int64ObservableGauge
	for i, g := range []struct{ name, help string }{
		{"paymesh.stream.messages", "Messages the stream holds."},
		{"paymesh.stream.bytes", "Bytes the stream's messages take."},
		{"paymesh.stream.max_messages", "Messages at which the stream refuses publishes."},
		{"paymesh.stream.max_bytes", "Bytes at which the stream refuses publishes."},
	} {
		var err error
		if gauges[i], err = meter.Int64ObservableGauge(g.name, metric.WithDescription(g.help)); err != nil {
			return fmt.Errorf("telemetry: %w", err)
		}
	}
	set := metric.WithAttributes(attribute.String("region", region), attribute.String("stream", stream))
	_, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		f, err := read(ctx)
		if err != nil {
			return nil
		}
		for i, v := range []int64{f.Msgs, f.Bytes, f.MaxMsgs, f.MaxBytes} {
			o.ObserveInt64(gauges[i], v, set)
		}
		return nil
	}, gauges[0], gauges[1], gauges[2], gauges[3])
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	return nil
}
