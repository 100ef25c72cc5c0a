package telemetry_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/platform/telemetry"
)

// TestObserveBacklog: paymesh_consumer_pending shows what a stream's
// Pending counts, and a stream that cannot be read leaves its series out
// instead of reporting a number.
func TestObserveBacklog(t *testing.T) {
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	five := func(context.Context) (int64, error) { return 5, nil }
	broken := func(context.Context) (int64, error) { return 0, errors.New("stream unreadable") }
	for stream, pending := range map[string]telemetry.Pending{"LEDGER_EU": five, "BROKEN": broken} {
		if err := m.ObserveBacklog("eu", stream, pending); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	if got, ok := scrape.One(t, srv.URL, "paymesh_consumer_pending", map[string]string{"region": "eu", "stream": "LEDGER_EU"}); !ok || got != 5 {
		t.Errorf("paymesh_consumer_pending{stream=LEDGER_EU}: got %v (present %v), want 5", got, ok)
	}
	if got, ok := scrape.One(t, srv.URL, "paymesh_consumer_pending", map[string]string{"stream": "BROKEN"}); ok {
		t.Errorf("paymesh_consumer_pending{stream=BROKEN}: got %v, want no sample", got)
	}
}

// TestObserveCounters: counters read their values at each scrape, under
// their names with _total and the attributes each sample was given.
func TestObserveCounters(t *testing.T) {
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	var n atomic.Int64
	if err := m.ObserveCounters("paymesh/test", telemetry.Single("paymesh.test.things", "Things counted.", n.Load,
		metric.WithAttributes(attribute.String("region", "eu")))); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	for _, want := range []int64{0, 7} {
		n.Store(want)
		if got := scrape.Sum(t, srv.URL, "paymesh_test_things_total", map[string]string{"region": "eu"}); got != want {
			t.Errorf("paymesh_test_things_total{region=eu}: got %d, want %d", got, want)
		}
	}
}
