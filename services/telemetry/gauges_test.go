package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/router"
	"github.com/paymesh/paymesh/services/telemetry"
)

// serve serves m's /metrics for the test and returns its URL.
func serve(t *testing.T, m *telemetry.Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// gauge returns the value of the one sample of name whose labels include
// want, and whether there is one.
func gauge(t *testing.T, url, name string, want map[string]string) (float64, bool) {
	t.Helper()
	var found []sample
	for _, s := range samples(t, url, name) {
		ok := true
		for k, v := range want {
			ok = ok && s.labels[k] == v
		}
		if ok {
			found = append(found, s)
		}
	}
	switch len(found) {
	case 0:
		return 0, false
	case 1:
		return found[0].value, true
	}
	t.Fatalf("%s%v: %d samples, want one", name, want, len(found))
	return 0, false
}

// TestConsumerPending: paymesh_consumer_pending counts the messages of the
// ledger and route streams not consumed yet, and a stream that cannot be
// read leaves its series out instead of reporting a number.
func TestConsumerPending(t *testing.T) {
	_, nc := natsembed.MustStart(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	topo := ledgerstream.Topology{Region: "eu", Shards: 2}
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if err := router.EnsureStream(ctx, js, "eu", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := js.Publish(ctx, topo.ShardSubject(i%2), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, fmt.Sprintf("route.eu.us.%d", i), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	broken := func(context.Context) (int64, error) { return 0, errors.New("stream unreadable") }
	for _, o := range []struct {
		stream  string
		pending telemetry.Pending
	}{
		{topo.Stream(), telemetry.LedgerPending(js, topo)},
		{router.Stream("eu"), telemetry.RoutePending(js, "eu")},
		{"LEDGER_US", telemetry.LedgerPending(js, ledgerstream.Topology{Region: "us"})}, // no such stream
		{"BROKEN", broken},
	} {
		if err := m.ObserveBacklog("eu", o.stream, o.pending); err != nil {
			t.Fatal(err)
		}
	}
	url := serve(t, m)
	for stream, want := range map[string]float64{topo.Stream(): 5, router.Stream("eu"): 3} {
		got, ok := gauge(t, url, "paymesh_consumer_pending", map[string]string{"region": "eu", "stream": stream})
		if !ok || got != want {
			t.Errorf("paymesh_consumer_pending{stream=%s}: got %v (present %v), want %v", stream, got, ok, want)
		}
	}
	for _, stream := range []string{"LEDGER_US", "BROKEN"} {
		if got, ok := gauge(t, url, "paymesh_consumer_pending", map[string]string{"stream": stream}); ok {
			t.Errorf("paymesh_consumer_pending{stream=%s}: got %v, want no sample", stream, got)
		}
	}
}

// TestInTransitOldest: paymesh_saga_in_transit_oldest_seconds is 0 with
// nothing in transit, then the age of the oldest debited cross-region
// transfer, and 0 again once it settled.
func TestInTransitOldest(t *testing.T) {
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveStore("eu", eu.Store); err != nil {
		t.Fatal(err)
	}
	url := serve(t, m)
	oldest := func() float64 {
		t.Helper()
		v, ok := gauge(t, url, "paymesh_saga_in_transit_oldest_seconds", map[string]string{"region": "eu"})
		if !ok {
			t.Fatal("paymesh_saga_in_transit_oldest_seconds{region=eu}: no sample")
		}
		return v
	}
	if got := oldest(); got != 0 {
		t.Errorf("nothing in transit: got %v, want 0", got)
	}
	a, b := eu.Account(t, "EUR", 1000), us.Account(t, "EUR", 0)
	cmd := eu.Transfer(t, a, b, 10)
	cmd.CreatedAt = time.Now().Add(-90 * time.Second)
	if r := eu.Apply(t, cmd)[0]; r.Kind != ledger.Applied || r.Transfer.Status != ledger.StatusDebited {
		t.Fatalf("debit: got %v %s, want applied DEBITED", r.Kind, r.Transfer.Status)
	}
	if got := oldest(); got < 90 || got > 120 {
		t.Errorf("one transfer debited 90s ago: got %v s, want about 90", got)
	}
	if r := eu.Apply(t, cmd.Step(ledger.TypeConfirm, ""))[0]; r.Kind != ledger.Applied {
		t.Fatalf("confirm: got %v %v, want applied", r.Kind, r.Err)
	}
	if got := oldest(); got != 0 {
		t.Errorf("settled: got %v, want 0", got)
	}
}
