// Package telemetry exports paymesh's counters as OpenTelemetry metrics,
// scraped in the Prometheus format at /metrics. The services count in plain
// atomic counters (ledger.Stats, router.Stats); the meter reads them through
// observable instruments at scrape time, so the hot paths carry no metrics
// code at all.
package telemetry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/router"
)

// Metrics is one process's meter provider and its Prometheus registry.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
}

// New returns a meter provider that exports to a fresh Prometheus registry.
func New() (*Metrics, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo(), otelprom.WithoutUnits())
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return &Metrics{provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), registry: reg}, nil
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// Shutdown stops the meter provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }

// counter is one observable counter and how to read it.
type counter struct {
	name, help string
	read       func(o metric.Observer, c metric.Int64ObservableCounter)
}

func (m *Metrics) observe(scope string, cs []counter) error {
	meter := m.provider.Meter(scope)
	insts := make([]metric.Int64ObservableCounter, len(cs))
	obs := make([]metric.Observable, len(cs))
	for i, c := range cs {
		inst, err := meter.Int64ObservableCounter(c.name, metric.WithDescription(c.help))
		if err != nil {
			return fmt.Errorf("telemetry: %s: %w", c.name, err)
		}
		insts[i], obs[i] = inst, inst
	}
	_, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for i, c := range cs {
			c.read(o, insts[i])
		}
		return nil
	}, obs...)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	return nil
}

// ObserveLedger exports a region ledger's counters. The duplicate rate of a
// region and stream is paymesh_duplicates_total / paymesh_deliveries_total.
func (m *Metrics) ObserveLedger(region, stream string, st *ledger.Stats) error {
	base := []attribute.KeyValue{attribute.String("region", region), attribute.String("stream", stream), attribute.String("consumer", "ledger")}
	set := metric.WithAttributes(base...)
	simple := func(name, help string, v func() int64) counter {
		return counter{name, help, func(o metric.Observer, c metric.Int64ObservableCounter) { o.ObserveInt64(c, v(), set) }}
	}
	return m.observe("paymesh/ledger", []counter{
		simple("paymesh.deliveries", "Messages delivered to the ledger, redeliveries included.", st.Deliveries.Load),
		simple("paymesh.redeliveries", "Deliveries after the first of the same message.", st.Redeliveries.Load),
		simple("paymesh.transfers.applied", "Commands applied (transfers, funds, saga steps).", st.Applied.Load),
		simple("paymesh.transfers.rejected", "Transfers recorded as refused.", st.Rejected.Load),
		simple("paymesh.dead.letters", "Messages sent to the dead-letter stream.", st.DeadLettered.Load),
		simple("paymesh.apply.retries", "Apply transactions retried (serialization, deadlock, lock timeout, races).", st.Retries.Load),
		simple("paymesh.apply.fenced", "Late commits refused because their claims were fenced off.", st.Fenced.Load),
		simple("paymesh.saga.parked", "Saga steps that arrived before the state they need.", st.Parked.Load),
		simple("paymesh.state.illegal.transitions", "State machine steps refused as illegal.", st.IllegalTransitions.Load),
		simple("paymesh.state.stale.versions", "Compare-and-set refused on a stale version.", st.StaleVersions.Load),
		{"paymesh.duplicates", "Duplicates caught, by the layer that caught them.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			dups := st.Duplicates()
			for _, l := range dedup.Layers {
				o.ObserveInt64(c, dups[string(l)], metric.WithAttributes(append(base, attribute.String("layer", string(l)))...))
			}
		}},
	})
}

// ObserveRouter exports a region router's counters; its duplicates are the
// ones JetStream's Nats-Msg-Id window caught, by stage.
func (m *Metrics) ObserveRouter(region string, st *router.Stats) error {
	at := func(stage string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String("stage", stage), attribute.String("layer", string(dedup.LayerMsgID)))
	}
	plain := metric.WithAttributes(attribute.String("region", region))
	return m.observe("paymesh/router", []counter{
		{"paymesh.router.submitted", "Commands stored in the local route stream.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Submitted.Load(), plain)
		}},
		{"paymesh.router.forwarded", "Commands acked by their home region.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Forwarded.Load(), plain)
		}},
		{"paymesh.router.retries", "Forwards and relays that failed and will be retried.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.ForwardRetries.Load(), metric.WithAttributes(attribute.String("region", region), attribute.String("stage", "forward")))
			o.ObserveInt64(c, st.RelayRetries.Load(), metric.WithAttributes(attribute.String("region", region), attribute.String("stage", "relay")))
		}},
		{"paymesh.router.relayed", "Saga steps acked by the region that applies them.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Relayed.Load(), plain)
		}},
		{"paymesh.router.duplicates", "Duplicates JetStream's Nats-Msg-Id window caught, by stage.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.DuplicateSubmits.Load(), at("submit"))
			o.ObserveInt64(c, st.ForwardDuplicates.Load(), at("forward"))
			o.ObserveInt64(c, st.RelayDuplicates.Load(), at("relay"))
		}},
	})
}
