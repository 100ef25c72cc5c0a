// Package telemetry exports paymesh's counters as OpenTelemetry metrics,
// scraped in the Prometheus format at /metrics. The services count in plain
// atomic counters (ledger.Stats, router.Stats); the meter reads them through
// observable instruments at scrape time, so the hot paths carry no metrics
// code at all.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/router"
)

// Metrics is one process's meter provider and its Prometheus registry.
type Metrics struct {
	provider metric.MeterProvider
	shutdown func(context.Context) error
	registry *prometheus.Registry
}

// New returns a meter provider that exports to a fresh Prometheus registry.
func New() (*Metrics, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo(), otelprom.WithoutUnits())
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	p := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	return &Metrics{provider: p, shutdown: p.Shutdown, registry: reg}, nil
}

// Disabled returns metrics that record nothing: its instruments come from
// a no-op meter provider and its handler serves no series. It is the
// baseline that telemetry's cost is measured against.
func Disabled() *Metrics {
	return &Metrics{provider: noop.NewMeterProvider(), shutdown: func(context.Context) error { return nil }, registry: prometheus.NewRegistry()}
}

// Handler serves /metrics: the Prometheus text format by default, and
// OpenMetrics, which carries the histograms' trace exemplars, to a scraper
// that asks for it (Accept: application/openmetrics-text).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// Endpoint is a running /metrics server.
type Endpoint struct {
	// URL is the address to scrape, http://host:port/metrics.
	URL string
	hs  *http.Server
}

// Serve binds addr (host:port; port 0 picks a free one) and serves GET
// /metrics there until Close. Binding before returning makes a port in use
// an error here rather than a line in the log.
func (m *Metrics) Serve(addr string, log *slog.Logger) (*Endpoint, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("telemetry: metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	e := &Endpoint{URL: "http://" + ln.Addr().String() + "/metrics",
		hs: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}}
	go func() {
		if err := e.hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return e, nil
}

// Close stops the server.
func (e *Endpoint) Close() error { return e.hs.Close() }

// Shutdown stops the meter provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.shutdown(ctx) }

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

// ObserveLedger exports a region ledger's counters. Deliveries and
// duplicates carry a topic label (ledger.Topic: the command kind a message
// carried), so the duplicate rate of a region and topic is
// paymesh_duplicates_total / paymesh_deliveries_total summed by region and
// topic.
func (m *Metrics) ObserveLedger(region, stream string, st *ledger.Stats) error {
	return m.observeLedger(region, stream, "ledger", st)
}

// ObserveApplied exports the counters of the transfers an API process
// applies itself (services/api, direct.go) under the ledger's names, with
// consumer="api" and no stream: summed by region, they count with the
// ledger's.
func (m *Metrics) ObserveApplied(region string, st *ledger.Stats) error {
	return m.observeLedger(region, "", "api", st)
}

func (m *Metrics) observeLedger(region, stream, consumer string, st *ledger.Stats) error {
	base := []attribute.KeyValue{attribute.String("region", region), attribute.String("stream", stream), attribute.String("consumer", consumer)}
	set := metric.WithAttributes(base...)
	simple := func(name, help string, v func() int64) counter {
		return counter{name, help, func(o metric.Observer, c metric.Int64ObservableCounter) { o.ObserveInt64(c, v(), set) }}
	}
	with := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append(append(make([]attribute.KeyValue, 0, len(base)+len(kv)), base...), kv...)...)
	}
	return m.observe("paymesh/ledger", []counter{
		{"paymesh.deliveries", "Messages delivered to the ledger, redeliveries included, by topic.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			for t, n := range st.DeliveriesByTopic() {
				o.ObserveInt64(c, n, with(attribute.String("topic", t.String())))
			}
		}},
		simple("paymesh.redeliveries", "Deliveries after the first of the same message.", st.Redeliveries.Load),
		simple("paymesh.transfers.applied", "Commands applied (transfers, funds, saga steps).", st.Applied.Load),
		simple("paymesh.transfers.rejected", "Transfers recorded as refused.", st.Rejected.Load),
		simple("paymesh.dead.letters", "Messages sent to the dead-letter stream.", st.DeadLettered.Load),
		simple("paymesh.apply.retries", "Apply transactions retried (serialization, deadlock, lock timeout, races).", st.Retries.Load),
		simple("paymesh.apply.fenced", "Late commits refused because their claims were fenced off.", st.Fenced.Load),
		simple("paymesh.apply.gave.up", "Transactions given up on a retryable error: the retry budget spent.", st.GaveUp.Load),
		simple("paymesh.apply.commits.unanswered", "COMMITs the server never answered; the consume-log was read back to learn the outcome.", st.CommitsUnanswered.Load),
		simple("paymesh.outbox.pruned", "Sent outbox rows deleted after their retention.", st.OutboxPruned.Load),
		simple("paymesh.transfers.awaiting.account", "Requests naming an account that does not exist: dead-lettered, unrecorded, applied by a replay once it exists.", st.AwaitingAccount.Load),
		simple("paymesh.saga.parked", "Saga steps that arrived before the state they need.", st.Parked.Load),
		simple("paymesh.state.illegal.transitions", "State machine steps refused as illegal.", st.IllegalTransitions.Load),
		simple("paymesh.state.stale.versions", "Compare-and-set refused on a stale version.", st.StaleVersions.Load),
		{"paymesh.duplicates", "Duplicates caught, by the layer that caught them and the topic they arrived on.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			dups := st.DuplicatesByTopic()
			for _, l := range ledger.Layers {
				for _, t := range ledger.Topics {
					if t == ledger.TopicUnknown {
						continue // a message that does not decode is dead-lettered, never a duplicate
					}
					o.ObserveInt64(c, dups[ledger.LayerTopic{Layer: l, Topic: t}],
						with(attribute.String("layer", string(l)), attribute.String("topic", t.String())))
				}
			}
		}},
	})
}

// The router's topics: the stream or hop its messages travel on. Route is
// the region's route stream (a submit), forward the hop of a command to its
// home region's ledger stream, relay the hop of a saga step from the
// outbox to the region that applies it.
const (
	TopicRoute   = "route"
	TopicForward = "forward"
	TopicRelay   = "relay"
)

// ObserveRouter exports a region router's counters; its duplicates are the
// ones JetStream's Nats-Msg-Id window caught, by stage and topic. The
// duplicate rate of a router topic is paymesh_router_duplicates_total over
// the topic's publishes acked (paymesh_router_submitted_total,
// _forwarded_total, _relayed_total, each labelled with its topic).
func (m *Metrics) ObserveRouter(region string, st *router.Stats) error {
	at := func(stage, topic string, kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append([]attribute.KeyValue{attribute.String("region", region), attribute.String("stage", stage),
			attribute.String("topic", topic)}, kv...)...)
	}
	msgID := attribute.String("layer", string(ledger.LayerMsgID))
	topic := func(t string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String("topic", t))
	}
	return m.observe("paymesh/router", []counter{
		{"paymesh.router.submitted", "Commands submitted in this region, duplicates included: stored in the route stream, or in the ledger stream for accounts homed here.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Submitted.Load(), topic(TopicRoute))
		}},
		{"paymesh.router.forwarded", "Commands acked by their home region.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Forwarded.Load(), topic(TopicForward))
		}},
		{"paymesh.router.retries", "Forwards and relays that failed and will be retried.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.ForwardRetries.Load(), at("forward", TopicForward))
			o.ObserveInt64(c, st.RelayRetries.Load(), at("relay", TopicRelay))
		}},
		{"paymesh.router.relayed", "Saga steps acked by the region that applies them.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.Relayed.Load(), topic(TopicRelay))
		}},
		{"paymesh.router.duplicates", "Duplicates JetStream's Nats-Msg-Id window caught, by stage and topic.", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, st.DuplicateSubmits.Load(), at("submit", TopicRoute, msgID))
			o.ObserveInt64(c, st.ForwardDuplicates.Load(), at("forward", TopicForward, msgID))
			o.ObserveInt64(c, st.RelayDuplicates.Load(), at("relay", TopicRelay, msgID))
		}},
	})
}

// LedgerObserver returns the hooks that record a region ledger's applied
// batches (size, transaction time) and saga stages (time since the
// transfer's creation). Each records with the context the consumer passes,
// so a sampled span there becomes the measurement's trace exemplar.
func (m *Metrics) LedgerObserver(region, stream string) (ledgerstream.Observer, error) {
	meter := m.provider.Meter("paymesh/ledger")
	size, err := meter.Int64Histogram("paymesh.apply.batch.size", metric.WithDescription("Commands per applied batch."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("telemetry: %w", err)
	}
	latency, err := meter.Float64Histogram("paymesh.apply.duration.seconds", metric.WithDescription("Time to apply one batch in one transaction."),
		metric.WithExplicitBucketBoundaries(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("telemetry: %w", err)
	}
	stages, err := meter.Float64Histogram("paymesh.saga.stage.duration.seconds",
		metric.WithDescription("Time from a cross-region transfer's creation until a saga stage ended here: credit (destination region), settle or refund (source region)."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("telemetry: %w", err)
	}
	set := metric.WithAttributes(attribute.String("region", region), attribute.String("stream", stream))
	return ledgerstream.Observer{
		Batch: func(ctx context.Context, n int, took time.Duration) {
			size.Record(ctx, int64(n), set)
			latency.Record(ctx, took.Seconds(), set)
		},
		Stage: func(ctx context.Context, stage string, since time.Duration) {
			stages.Record(ctx, since.Seconds(), metric.WithAttributes(attribute.String("region", region), attribute.String("stage", stage)))
		},
	}, nil
}

// ObserveStore exports, at each scrape, the region's money in transit (how
// many transfers, their amount and the age of the oldest) and its outbox
// lag: three small queries on the region's database.
func (m *Metrics) ObserveStore(region string, store *postgres.Store) error {
	meter := m.provider.Meter("paymesh/saga")
	set := metric.WithAttributes(attribute.String("region", region))
	transfers, err := meter.Int64ObservableGauge("paymesh.saga.in.transit", metric.WithDescription("Cross-region transfers debited here and not settled yet."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	amount, err := meter.Int64ObservableGauge("paymesh.saga.in.transit.amount", metric.WithDescription("Their amount, in minor units."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	unsent, err := meter.Int64ObservableGauge("paymesh.outbox.unsent", metric.WithDescription("Saga steps in the outbox not relayed yet."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	age, err := meter.Float64ObservableGauge("paymesh.outbox.lag.seconds", metric.WithDescription("Age of the oldest unsent outbox row."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	oldest, err := meter.Float64ObservableGauge("paymesh.saga.in.transit.oldest.seconds",
		metric.WithDescription("Age, since its creation, of the oldest cross-region transfer debited here and not settled yet (0: none)."))
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if n, a, err := store.InTransit(ctx); err == nil {
			o.ObserveInt64(transfers, n, set)
			o.ObserveInt64(amount, a, set)
		}
		if a, err := store.InTransitOldest(ctx); err == nil {
			o.ObserveFloat64(oldest, a.Seconds(), set)
		}
		if n, lag, err := store.OutboxLag(ctx); err == nil {
			o.ObserveInt64(unsent, n, set)
			o.ObserveFloat64(age, lag.Seconds(), set)
		}
		return nil
	}, transfers, amount, oldest, unsent, age)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	return nil
}

// ObserveAPI exports the API's idempotency outcomes: the duplicates the
// HTTP layer (ledger.LayerIdempotencyKey) caught, all of the transfer
// topic, the only request that takes an Idempotency-Key. The counters are
// api.Stats' (Replays, Mismatches, InFlight), taken one by one so that
// what imports telemetry (every service) does not link the HTTP API.
func (m *Metrics) ObserveAPI(region string, replays, mismatches, inFlight *atomic.Int64) error {
	at := func(outcome string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String("outcome", outcome),
			attribute.String("layer", string(ledger.LayerIdempotencyKey)), attribute.String("topic", ledger.TopicTransfer.String()))
	}
	return m.observe("paymesh/api", []counter{
		{"paymesh.idempotency.keys", "Repeated Idempotency-Keys: replays, reuse with another body (422), repeats in flight (409).", func(o metric.Observer, c metric.Int64ObservableCounter) {
			o.ObserveInt64(c, replays.Load(), at("replay"))
			o.ObserveInt64(c, mismatches.Load(), at("mismatch"))
			o.ObserveInt64(c, inFlight.Load(), at("in_flight"))
		}},
	})
}

// Served is a service's own meter provider and the /metrics endpoint that
// serves it.
type Served struct {
	Metrics *Metrics
	// URL is the address to scrape, http://host:port/metrics.
	URL string
	e   *Endpoint
}

// ServeNew returns a new meter provider whose instruments observe
// registers, served at listen (host:port; port 0 picks a free one). It
// returns observe's error, or the bind error, after releasing what it made.
func ServeNew(listen string, log *slog.Logger, observe func(*Metrics) error) (*Served, error) {
	m, err := New()
	if err != nil {
		return nil, err
	}
	if err := observe(m); err != nil {
		return nil, errors.Join(err, m.Shutdown(context.Background()))
	}
	e, err := m.Serve(listen, log)
	if err != nil {
		return nil, errors.Join(err, m.Shutdown(context.Background()))
	}
	return &Served{Metrics: m, URL: e.URL, e: e}, nil
}

// Close stops the endpoint, then the meter provider, and returns their
// errors joined.
func (s *Served) Close() error {
	return errors.Join(s.e.Close(), s.Metrics.Shutdown(context.Background()))
}
