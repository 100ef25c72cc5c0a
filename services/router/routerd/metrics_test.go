package routerd_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/router"
	"github.com/paymesh/paymesh/services/router/routerd"
)

// TestRoutePending: paymesh_consumer_pending counts the messages of the
// route stream not forwarded yet.
func TestRoutePending(t *testing.T) {
	_, nc := natsembed.MustStart(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := router.EnsureStream(ctx, js, "eu", time.Minute, 0, ledgerstream.Limits{}); err != nil {
		t.Fatal(err)
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
	if err := m.ObserveBacklog("eu", router.Stream("eu"), routerd.Pending(js, "eu")); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	if got, ok := scrape.One(t, srv.URL, "paymesh_consumer_pending", map[string]string{"region": "eu", "stream": router.Stream("eu")}); !ok || got != 3 {
		t.Errorf("paymesh_consumer_pending{stream=%s}: got %v (present %v), want 3", router.Stream("eu"), got, ok)
	}
}
