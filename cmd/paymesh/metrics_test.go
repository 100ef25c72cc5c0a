package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
)

// freeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRouterAndAPIServeMetrics: `paymesh router` and `paymesh api` serve
// their counters at /metrics on --metrics-listen, and stop serving when
// they stop.
func TestRouterAndAPIServeMetrics(t *testing.T) {
	srv, _ := natsembed.MustStart(t)
	f := ledgertest.New(t)
	u, _ := url.Parse(f.URL)
	db := regionDB{Region: "eu", PostgresURL: f.URL, Database: strings.TrimPrefix(u.Path, "/")}
	tab, ids := defaultRegions(t)
	log := slog.New(slog.DiscardHandler)
	routerAddr, apiAddr := freeAddr(t), freeAddr(t)
	services := map[string]struct {
		addr, metric string
		run          func(context.Context) error
	}{
		"router": {routerAddr, `paymesh_router_submitted_total{region="eu",topic="route"}`, func(ctx context.Context) error {
			c := &routerCmd{regionDB: db, regionNATS: regionNATS{NATSURL: srv.ClientURL(), StreamReplicas: 1}, Shards: 4, AckWait: time.Second, Metrics: routerAddr,
				security: security{InsecureDev: true}}
			return c.Run(ctx, tab, ids, log)
		}},
		"api": {apiAddr, `paymesh_idempotency_keys_total{cause="client_retry",layer="idempotency_key",outcome="replay",region="eu",topic="transfer"}`, func(ctx context.Context) error {
			c := &apiCmd{regionDB: db, regionNATS: regionNATS{NATSURL: srv.ClientURL(), StreamReplicas: 1}, Listen: "127.0.0.1:0", Node: 7, Shards: 4, Wait: time.Second,
				KeyTTL: time.Hour, Metrics: apiAddr, security: security{InsecureDev: true}}
			return c.Run(ctx, tab, ids, log)
		}},
	}
	for name, s := range services {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.run(ctx) }()
			var body string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !strings.Contains(body, s.metric); time.Sleep(50 * time.Millisecond) {
				if res, err := http.Get("http://" + s.addr + "/metrics"); err == nil {
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					body = string(b)
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !strings.Contains(body, s.metric) {
				t.Fatalf("%s /metrics lacks %s:\n%s", name, s.metric, body)
			}
			if _, err := http.Get("http://" + s.addr + "/metrics"); err == nil {
				t.Errorf("%s: /metrics still served after the command returned", name)
			}
		})
	}
}
