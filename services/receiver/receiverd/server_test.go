package receiverd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/receiver"
	"github.com/paymesh/paymesh/services/receiver/receiverd"
	"github.com/paymesh/paymesh/services/webhooks"
)

const apiKey = "pm_receiver_test_0123456789abcdef"

// TestReceivesARegion: a region's webhooks to the receiver service. 1,001
// events of one account arrive in sequence order (none waits parked) and
// are applied once each; a redelivery requested through the API is a
// duplicate named for its cause; /gaps and /metrics say so.
func TestReceivesARegion(t *testing.T) {
	ctx := context.Background()
	topo := natsembed.MustStartTopology(t, "eu")
	c, err := cluster.Start(ctx, cluster.Config{Regions: map[string]uint8{"eu": 1}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_recv_%d_", os.Getpid()), Shards: 2, BatchSize: 64, AckWait: 2 * time.Second,
		APIWait: 3 * time.Second, KeyTTL: time.Hour, API: func(_ string, a *apid.Config) {
			a.WebhookAllowHosts = []string{"127.0.0.1"}
			a.WebhookSchedule = webhooks.Schedule{First: 100 * time.Millisecond, Longest: time.Second, MaxAge: time.Hour}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	eu := c.Region("eu")
	if err := eu.APIStore.PutClient(ctx, api.RegisteredClient{ID: "shop", Name: "shop"}, apiKey); err != nil {
		t.Fatal(err)
	}
	cl := &api.Client{BaseURL: eu.APIURL, APIKey: apiKey}

	// The endpoint first, at the address the receiver will listen on, then
	// the receiver with the endpoint's secret (a delivery before it starts
	// fails, and is tried again).
	listen := freeAddr(t)
	var ep api.WebhookEndpointBody
	mustJSON(t, must(cl.CreateWebhookEndpoint(ctx, api.WebhookEndpointRequest{URL: "http://" + listen + receiverd.Path}, "hook-1")), &ep)
	_, url := pgtest.MustDatabase(t)
	srv, err := receiverd.Open(ctx, receiverd.Config{Listen: listen, MetricsListen: "127.0.0.1:0", PostgresURL: url,
		Secrets: []string{ep.Secret}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done; _ = srv.Close() })

	var from, to api.AccountBody
	mustJSON(t, must(cl.CreateAccount(ctx, api.AccountRequest{Currency: "EUR"}, "acct-from")), &from)
	mustJSON(t, must(cl.CreateAccount(ctx, api.AccountRequest{Currency: "EUR"}, "acct-to")), &to)
	gen, err := idgen.NewGenerator(c.IDs(), "eu", 900)
	if err != nil {
		t.Fatal(err)
	}
	fundID, err := gen.NextString()
	if err != nil {
		t.Fatal(err)
	}
	fund := ledger.Command{Type: ledger.TypeFund, TransferID: fundID, ClientID: "ops", IdempotencyKey: "fund-" + from.ID,
		To: from.ID, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()}
	if err := c.Submit(ctx, "eu", fund); err != nil {
		t.Fatal(err)
	}
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitQuiet(qctx); err != nil {
		t.Fatal(err)
	}
	// Account opened, funded (created, completed), then 499 transfers of
	// two events each: 1,001 events of the source account, and the
	// destination's opening.
	for i := range 499 {
		req := api.TransferRequest{From: from.ID, To: to.ID, Amount: 1, Currency: "EUR"}
		if _, err := cl.SendTransfer(ctx, req, fmt.Sprintf("t-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	recv := srv.Receiver()
	waitFor(t, "1,001 events of the source and 1 of the destination applied", func() bool {
		tot, err := recv.Totals(ctx)
		return err == nil && tot.Applied >= 1002
	})
	ev := api.EventID(from.ID, 1000)
	if r, err := cl.PostOnce(ctx, "/v1/events/"+ev+"/redeliver", nil); err != nil || r.Status != http.StatusAccepted {
		t.Fatalf("redeliver %s: %+v %v", ev, r, err)
	}
	waitFor(t, "the redelivery", func() bool { return recv.Stats().Duplicates(receiver.CauseRedelivery) == 1 })

	tot, err := recv.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tot.Applied != 1002 || tot.Effects != 1002 || tot.Parked != 0 || recv.Stats().Parked.Load() != 0 {
		t.Errorf("totals %+v, %d parked on the way: want 1,002 applied once each, in order", tot, recv.Stats().Parked.Load())
	}
	gaps := get(t, strings.TrimSuffix(srv.URL(), receiverd.Path)+"/gaps")
	if gaps != `{"gaps":[]}` {
		t.Errorf("GET /gaps: %s", gaps)
	}
	if got := scrape.Sum(t, srv.MetricsURL(), "paymesh_receiver_duplicates_total", map[string]string{"cause": "redelivery"}); got != 1 {
		t.Errorf("paymesh_receiver_duplicates_total{cause=redelivery} = %d, want 1", got)
	}
	if got := scrape.Sum(t, srv.MetricsURL(), "paymesh_receiver_events_total", map[string]string{"outcome": "applied"}); got != 1002 {
		t.Errorf("paymesh_receiver_events_total{outcome=applied} = %d, want 1002", got)
	}
}

func must(r api.Response, err error) api.Response {
	if err != nil {
		panic(err)
	}
	return r
}

func mustJSON(t *testing.T, r api.Response, v any) {
	t.Helper()
	if r.Status/100 != 2 {
		t.Fatalf("answer %d %s", r.Status, r.Body)
	}
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
