package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// Counter is one observable counter: its name, its help text and how to
// read it at a scrape.
type Counter struct {
	Name, Help string
	// Read observes the counter's current values with o, one per set of
	// attributes.
	Read func(o metric.Observer, c metric.Int64ObservableCounter)
}

// Single returns a counter of one series: v's value, with the attributes
// of set.
func Single(name, help string, v func() int64, set metric.MeasurementOption) Counter {
	return Counter{name, help, func(o metric.Observer, c metric.Int64ObservableCounter) { o.ObserveInt64(c, v(), set) }}
}

// ObserveCounters registers cs with the meter of scope, read at every
// scrape in one callback. It returns an error naming the counter that
// could not be made.
func (m *Metrics) ObserveCounters(scope string, cs ...Counter) error {
	meter := m.provider.Meter(scope)
	insts := make([]metric.Int64ObservableCounter, len(cs))
	obs := make([]metric.Observable, len(cs))
	for i, c := range cs {
		inst, err := meter.Int64ObservableCounter(c.Name, metric.WithDescription(c.Help))
		if err != nil {
			return fmt.Errorf("telemetry: %s: %w", c.Name, err)
		}
		insts[i], obs[i] = inst, inst
	}
	_, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for i, c := range cs {
			c.Read(o, insts[i])
		}
		return nil
	}, obs...)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	return nil
}
