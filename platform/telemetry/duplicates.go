package telemetry

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// AgeBuckets are the duplicate ages' bucket bounds, in seconds: from a
// repeat within one batch to two weeks, with each day up to the
// consume-log's default window of seven, so that an age nearing it shows.
var AgeBuckets = []float64{0.001, 0.01, 0.1, 0.5, 1, 5, 30, 60, 300, 900, 3600, 6 * 3600,
	86400, 2 * 86400, 3 * 86400, 4 * 86400, 5 * 86400, 6 * 86400, 7 * 86400, 14 * 86400}

// DuplicateAges records each duplicate a region's service caught in
// paymesh_duplicate_age_seconds, by region, topic, layer, cause and
// service: its age since the first effect of its key. It records with the
// context it is given, so a sampled span there (the duplicate's delivery,
// the request's) becomes the bucket's trace exemplar: the histogram is
// what a dashboard opens a duplicate's trace from, where the duplicate
// counters, observed at each scrape, carry none. A nil *DuplicateAges
// records nothing.
type DuplicateAges struct {
	h       metric.Float64Histogram
	region  string
	service string
}

// NewDuplicateAges returns the recorder of a region's service (ledger,
// router, api). It returns an error when the instrument cannot be made.
func NewDuplicateAges(m *Metrics, region, service string) (*DuplicateAges, error) {
	h, err := m.Meter("paymesh/duplicates").Float64Histogram("paymesh.duplicate.age.seconds",
		metric.WithDescription("Age of each duplicate caught (the time since the first effect of its key), by region, topic, layer, cause and service."),
		metric.WithExplicitBucketBoundaries(AgeBuckets...))
	if err != nil {
		return nil, fmt.Errorf("duplicate age metric: %w", err)
	}
	return &DuplicateAges{h: h, region: region, service: service}, nil
}

// Record records one duplicate of topic caught by layer, sent again for
// cause, age after its key's first effect.
func (d *DuplicateAges) Record(ctx context.Context, topic, layer, cause string, age time.Duration) {
	if d == nil {
		return
	}
	d.h.Record(ctx, age.Seconds(), metric.WithAttributes(attribute.String("region", d.region), attribute.String("topic", topic),
		attribute.String("layer", layer), attribute.String("cause", cause), attribute.String("service", d.service)))
}

// ObserveWindows exports each dedup layer's window in force in a region,
// in paymesh_dedup_window_seconds{region, layer}: how long after its first
// effect a duplicate can still be caught by that layer (the consume-log's
// retention, the Msg-Id window, the idempotency keys' time to live). An
// alert compares the duplicates' ages with it. It returns an error when the
// gauge cannot be made.
func (m *Metrics) ObserveWindows(region string, windows map[string]time.Duration) error {
	g, err := m.provider.Meter("paymesh/duplicates").Float64ObservableGauge("paymesh.dedup.window.seconds",
		metric.WithDescription("How long after its first effect a duplicate can still be caught by a dedup layer: its window in force, by region and layer."))
	if err != nil {
		return fmt.Errorf("telemetry: dedup window: %w", err)
	}
	_, err = m.provider.Meter("paymesh/duplicates").RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for layer, w := range windows {
			o.ObserveFloat64(g, w.Seconds(), metric.WithAttributes(attribute.String("region", region), attribute.String("layer", layer)))
		}
		return nil
	}, g)
	if err != nil {
		return fmt.Errorf("telemetry: dedup window: %w", err)
	}
	return nil
}
