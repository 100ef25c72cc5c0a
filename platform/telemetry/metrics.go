// Package telemetry is the services' shared OpenTelemetry set-up: a meter
// provider exported in the Prometheus format at /metrics, the helpers that
// register observable counters and stream backlogs with it, and the trace
// provider the OTEL_* variables ask for. It knows no service: each service
// registers its own instruments (services/ledger/ledgerd,
// services/router/routerd, services/api/apid). The services count in plain
// atomic counters; the meter reads them through observable instruments at
// scrape time, so the hot paths carry no metrics code at all.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
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

// Meter returns the meter of an instrumentation scope ("paymesh/ledger",
// say), with which a service makes its own instruments.
func (m *Metrics) Meter(scope string) metric.Meter { return m.provider.Meter(scope) }

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
