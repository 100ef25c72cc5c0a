package ledgerd_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// serve serves m's /metrics for the test and returns its URL.
func serve(t *testing.T, m *telemetry.Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// mustStreams starts a JetStream server with topo's streams and publishes n
// messages over its first two shards.
func mustStreams(tb testing.TB, topo ledgerstream.Topology, n int) jetstream.JetStream {
	tb.Helper()
	_, nc := natsembed.MustStart(tb)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, subjects.LedgerSubject(topo.Region, i%2, subjects.ClassCommand, topo.Region), []byte("{}")); err != nil {
			tb.Fatal(err)
		}
	}
	return js
}

// TestLedgerPending: paymesh_consumer_pending counts the messages of the
// ledger stream not consumed yet, over its shards, and a ledger stream
// that does not exist leaves its series out instead of reporting a number.
func TestLedgerPending(t *testing.T) {
	topo := ledgerstream.Topology{Region: "eu", Shards: 2}
	js := mustStreams(t, topo, 5)
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveBacklog("eu", topo.Stream(), ledgerd.Pending(js, topo)); err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveBacklog("eu", "LEDGER_US", ledgerd.Pending(js, ledgerstream.Topology{Region: "us"})); err != nil { // no such stream
		t.Fatal(err)
	}
	url := serve(t, m)
	// The shards' consumers count the publishes a moment after their
	// PubAcks (a loaded fresh-clone run read 2 of 5): wait for them.
	got, ok := scrape.One(t, url, "paymesh_consumer_pending", map[string]string{"region": "eu", "stream": topo.Stream()})
	for deadline := time.Now().Add(10 * time.Second); (!ok || got != 5) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		got, ok = scrape.One(t, url, "paymesh_consumer_pending", map[string]string{"region": "eu", "stream": topo.Stream()})
	}
	if !ok || got != 5 {
		t.Errorf("paymesh_consumer_pending{stream=%s}: got %v (present %v), want 5", topo.Stream(), got, ok)
	}
	if got, ok := scrape.One(t, url, "paymesh_consumer_pending", map[string]string{"stream": "LEDGER_US"}); ok {
		t.Errorf("paymesh_consumer_pending{stream=LEDGER_US}: got %v, want no sample", got)
	}
}

// TestStreamFill: paymesh_stream_messages and _bytes count what the ledger
// and dead-letter streams hold, against the bounds at which they refuse
// publishes (_max_messages, _max_bytes); a stream that does not exist
// leaves its series out.
func TestStreamFill(t *testing.T) {
	topo := ledgerstream.Topology{Region: "eu", Shards: 2, Limits: ledgerstream.Limits{MaxMsgs: 10}}
	js := mustStreams(t, topo, 7)
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{topo.Stream(), topo.DLQStream(), "LEDGER_US"} {
		if err := m.ObserveFill("eu", stream, ledgerstream.FillOf(js, stream)); err != nil {
			t.Fatal(err)
		}
	}
	url := serve(t, m)
	for _, c := range []struct {
		stream, metric string
		want           float64
	}{
		{topo.Stream(), "paymesh_stream_messages", 7},
		{topo.Stream(), "paymesh_stream_max_messages", 10},
		{topo.Stream(), "paymesh_stream_max_bytes", float64(ledgerstream.DefaultLimits.MaxBytes)},
		{topo.DLQStream(), "paymesh_stream_messages", 0},
		{topo.DLQStream(), "paymesh_stream_max_messages", float64(ledgerstream.DefaultDLQLimits.MaxMsgs)},
	} {
		if got, ok := scrape.One(t, url, c.metric, map[string]string{"region": "eu", "stream": c.stream}); !ok || got != c.want {
			t.Errorf("%s{stream=%s}: got %v (present %v), want %v", c.metric, c.stream, got, ok, c.want)
		}
	}
	if got, ok := scrape.One(t, url, "paymesh_stream_bytes", map[string]string{"stream": topo.Stream()}); !ok || got <= 0 {
		t.Errorf("paymesh_stream_bytes{stream=%s}: got %v (present %v), want the bytes of 7 messages", topo.Stream(), got, ok)
	}
	if got, ok := scrape.One(t, url, "paymesh_stream_messages", map[string]string{"stream": "LEDGER_US"}); ok {
		t.Errorf("paymesh_stream_messages{stream=LEDGER_US}: got %v, want no sample", got)
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
	if err := ledgerd.ObserveStore(m, "eu", eu.Store); err != nil {
		t.Fatal(err)
	}
	url := serve(t, m)
	oldest := func() float64 {
		t.Helper()
		v, ok := scrape.One(t, url, "paymesh_saga_in_transit_oldest_seconds", map[string]string{"region": "eu"})
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
