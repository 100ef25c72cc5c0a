package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/paymesh/paymesh/platform/telemetry"
)

// scrapeEvery is how often the bench scrapes each service's /metrics: the
// scrape interval of deploy/prometheus/prometheus.yml.
const scrapeEvery = 5 * time.Second

// Telemetry is what the runs' telemetry did: the services traced as
// shipped and their /metrics scraped as the compose deployment's
// Prometheus scrapes them.
type Telemetry struct {
	// Sampler is OTEL_TRACES_SAMPLER, or paymesh's default when unset.
	Sampler string `json:"sampler"`
	// Endpoint is where the traces went: the OTLP endpoint the OTEL_*
	// variables name, or the bench's own receiver.
	Endpoint string `json:"endpoint"`
	// Spans is how many spans the bench process exported (the process
	// scenarios' services export theirs on their own).
	Spans int64 `json:"spans"`
	// ReceivedBytes is what the bench's receiver took, from every process
	// (0 when the traces went to a collector of the OTEL_* variables).
	ReceivedBytes int64 `json:"received_bytes"`
	Scrapes       int64 `json:"scrapes"`
	// ScrapeErrors counts the failed scrapes of a service that had
	// answered one.
	ScrapeErrors int64 `json:"scrape_errors"`
}

// shipped is the telemetry of a bench with --telemetry: a tracer provider
// as the services install it from the OTEL_* variables, exporting over
// OTLP/HTTP to a receiver in this process that reads and drops what it is
// sent (the collector runs on another machine in a deployment: the
// services pay for encoding and sending, not for storing), and the
// scrapes of every service's /metrics.
type shipped struct {
	endpoint string
	srv      *http.Server
	stop     func(context.Context) error
	spans    atomic.Int64
	received atomic.Int64
	scrapes  atomic.Int64
	failed   atomic.Int64
}

// startTelemetry installs the tracer provider and starts the receiver,
// unless the OTEL_* variables name a collector: then the provider the
// command installed from them exports there.
func startTelemetry(ctx context.Context) (*shipped, error) {
	t := &shipped{stop: func(context.Context) error { return nil }}
	if telemetry.TracingEnabled() {
		t.endpoint = os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
		if t.endpoint == "" {
			t.endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
		}
		return t, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t.endpoint = "http://" + l.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		t.received.Add(n)
		// An empty ExportTraceServiceResponse: every span accepted.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})
	t.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = t.srv.Serve(l) }()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(t.endpoint+"/v1/traces"))
	if err != nil {
		_ = t.srv.Close()
		return nil, err
	}
	stop, err := telemetry.SetupTracing(ctx, "paymesh-bench", telemetry.RetrySampler(telemetry.DefaultTraceRatio), sdktrace.NewBatchSpanProcessor(countingExporter{exp, &t.spans}))
	if err != nil {
		_ = t.srv.Close()
		return nil, err
	}
	t.stop = stop
	return t, nil
}

// close flushes and stops the provider, puts the no-op one back and
// stops the receiver.
func (t *shipped) close(ctx context.Context) {
	_ = t.stop(ctx)
	if t.srv != nil {
		otel.SetTracerProvider(noop.NewTracerProvider())
		_ = t.srv.Close()
	}
}

// flush exports the spans the provider holds.
func (t *shipped) flush(ctx context.Context) {
	if tp, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		_ = tp.ForceFlush(ctx)
	}
}

// env returns the OTEL_* variables a service process started by the bench
// exports its traces with, as a deployment's does (the sampler, when set,
// is inherited with the rest of the environment).
func (t *shipped) env(service string) []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + t.endpoint, "OTEL_SERVICE_NAME=" + service}
}

// result returns what the telemetry did so far.
func (t *shipped) result() *Telemetry {
	sampler := os.Getenv("OTEL_TRACES_SAMPLER")
	if sampler == "" {
		sampler = telemetry.RetrySampler(telemetry.DefaultTraceRatio).Description() + " (paymesh's default)"
	}
	return &Telemetry{Sampler: sampler, Endpoint: t.endpoint, Spans: t.spans.Load(), ReceivedBytes: t.received.Load(),
		Scrapes: t.scrapes.Load(), ScrapeErrors: t.failed.Load()}
}

// scrape fetches each of urls every scrapeEvery, the first time at once,
// until the returned func is called. Until the url has answered
// (a service process scraped from its start listens a moment later) it
// is tried every 100 ms, and only a failure after that counts.
func (t *shipped) scrape(urls ...string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	client := &http.Client{Timeout: scrapeEvery}
	for _, u := range urls {
		if u == "" {
			continue
		}
		wg.Go(func() {
			up := false // a service process may not listen yet: its failures count once it answered
			for {
				err := t.fetch(ctx, client, u)
				up = up || err == nil
				if err != nil && up && ctx.Err() == nil {
					t.failed.Add(1)
				}
				wait := scrapeEvery
				if !up {
					wait = 100 * time.Millisecond
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

func (t *shipped) fetch(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	t.scrapes.Add(1)
	return nil
}

// metricsListen is where an in-process ledger serves /metrics: a free
// port with the telemetry on, nowhere without it.
func (e *env) metricsListen() string {
	if e.tel == nil {
		return ""
	}
	return "127.0.0.1:0"
}

// scrape scrapes urls with the telemetry on; the returned func stops it.
func (e *env) scrape(urls ...string) (stop func()) {
	if e.tel == nil {
		return func() {}
	}
	return e.tel.scrape(urls...)
}

// countingExporter counts the spans it exports.
type countingExporter struct {
	sdktrace.SpanExporter
	spans *atomic.Int64
}

func (c countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	c.spans.Add(int64(len(spans)))
	return c.SpanExporter.ExportSpans(ctx, spans)
}
