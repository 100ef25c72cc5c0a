package apid_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/apicheck"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/nodelease"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
)

// TestAPIServes opens a region's ledger (it migrates the ledger's tables)
// and its API (it migrates its own), registers a client and opens an
// account over HTTP. /metrics is
// served, Run ends with its context, and after Close a second API opens on
// the same HTTP and metrics addresses.
func TestAPIServes(t *testing.T) {
	ns, _ := natsembed.MustStart(t)
	_, url := pgtest.MustDatabase(t)
	ids, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	led, err := ledgerd.Open(ctx, ledgerd.Config{Region: "eu", Regions: ids, Node: 1, PostgresURL: url, NATSURL: ns.ClientURL(), Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	cfg := apid.Config{Region: "eu", Regions: ids, Node: 2, PostgresURL: url, NATSURL: ns.ClientURL(), Shards: 2,
		MetricsListen: "127.0.0.1:0"}
	srv, err := apid.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The API migrated its own tables at Open.
	const key = "pm_test_key_0123456789"
	if err := srv.Store().PutClient(ctx, api.RegisteredClient{ID: "acme"}, key); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()

	c := &api.Client{BaseURL: srv.URL(), APIKey: key, HTTP: apicheck.Client(t)}
	resp, err := c.CreateAccount(ctx, api.AccountRequest{Currency: "EUR"}, "")
	if err != nil || resp.Status != http.StatusCreated || !strings.Contains(string(resp.Body), `"currency":"EUR"`) {
		t.Fatalf("POST /v1/accounts at %s: got %d %s %v, want 201 with the account", srv.URL(), resp.Status, resp.Body, err)
	}
	if body := scrape.Text(t, srv.MetricsURL()); !strings.Contains(body, `paymesh_idempotency_keys_total{cause="client_retry",layer="idempotency_key",outcome="replay",region="eu",topic="transfer"}`) {
		t.Fatalf("metrics at %s: no paymesh_idempotency_keys_total in\n%s", srv.MetricsURL(), body)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	cfg.Listen = strings.TrimPrefix(srv.URL(), "http://")
	cfg.MetricsListen = strings.TrimSuffix(strings.TrimPrefix(srv.MetricsURL(), "http://"), "/metrics")
	if err := srv.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	again, err := apid.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("second open on %s and %s after Close: %v", cfg.Listen, cfg.MetricsListen, err)
	}
	if again.URL() != "http://"+cfg.Listen {
		t.Errorf("second open: got URL %s, want http://%s", again.URL(), cfg.Listen)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAPIOpenErrors: a taken listen address and an unknown region are
// errors that say so, and release what Open had opened.
func TestAPIOpenErrors(t *testing.T) {
	ns, _ := natsembed.MustStart(t)
	_, url := pgtest.MustDatabase(t)
	ids, _ := idgen.NewRegions(map[string]uint8{"eu": 1})
	ctx := context.Background()
	if _, err := apid.Open(ctx, apid.Config{Region: "mars", Regions: ids, PostgresURL: url, NATSURL: ns.ClientURL()}); err == nil || !strings.Contains(err.Error(), "mars") {
		t.Fatalf("unknown region: got %v, want an error naming it", err)
	}
	first, err := apid.Open(ctx, apid.Config{Region: "eu", Regions: ids, PostgresURL: url, NATSURL: ns.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	taken := strings.TrimPrefix(first.URL(), "http://")
	if _, err := apid.Open(ctx, apid.Config{Region: "eu", Regions: ids, Node: 1, PostgresURL: url, NATSURL: ns.ClientURL(), Listen: taken}); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("address in use: got %v, want a listen error", err)
	}
}

// TestAPINodeLeased: a second API asking for the node id a live API holds
// is refused with an error naming the holder (on a build without node
// leases it opened, and the two minted the same transfer IDs); after the
// first closes, the node is free at once.
func TestAPINodeLeased(t *testing.T) {
	ns, _ := natsembed.MustStart(t)
	_, url := pgtest.MustDatabase(t)
	ids, _ := idgen.NewRegions(map[string]uint8{"eu": 1})
	ctx := context.Background()
	cfg := apid.Config{Region: "eu", Regions: ids, Node: 2, PostgresURL: url, NATSURL: ns.ClientURL(), NodeTTL: time.Second}
	first, err := apid.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := apid.Open(ctx, cfg)
	if err == nil {
		second.Close()
		t.Fatal("second API on node 2 opened; want it refused while the first holds the node")
	}
	if !errors.Is(err, nodelease.ErrHeld) || !strings.Contains(err.Error(), "held by \"api ") {
		t.Fatalf("second API on node 2: got %v, want ErrHeld naming the first API", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := apid.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open after the holder closed: %v", err)
	}
	_ = again.Close()
}

// TestOperatorAPIDisabled: an API opened without the region's operator
// NATS user answers its operator endpoints with 503 operator_api_disabled
// to an operator key (403 operator_only to a client's, checked first); an
// API given the operator user with a wrong password does not open, and
// says which user failed.
func TestOperatorAPIDisabled(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu")
	_, url := pgtest.MustDatabase(t)
	ids, _ := idgen.NewRegions(map[string]uint8{"eu": 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	au, _ := natsauth.UserOf("eu", natsauth.API)
	ou, _ := natsauth.UserOf("eu", natsauth.Ops)
	cfg := apid.Config{Region: "eu", Regions: ids, Node: 2, PostgresURL: url, NATSURL: topo.ClientURL("eu"), NATSUser: au.Name, NATSPassword: au.Password}
	srv, err := apid.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() { _ = srv.Run(ctx) }()
	for id, role := range map[string]api.Role{"alice": api.RoleOperator, "acme": api.RoleClient} {
		if err := srv.Store().PutClient(ctx, api.RegisteredClient{ID: id, Role: role}, "key-"+id+"-0123456789"); err != nil {
			t.Fatal(err)
		}
	}
	hc := apicheck.Client(t)
	call := func(method, path, key, body string) (int, api.Problem) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p api.Problem
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p
	}
	for _, rq := range []struct{ method, path, body string }{
		{"GET", "/v1/ops/dead-letters", ""},
		{"GET", "/v1/ops/dead-letters/1", ""},
		{"POST", "/v1/ops/dead-letters/1/replay", ""},
		{"POST", "/v1/ops/dead-letters/1/discard", `{"reason":"r"}`},
	} {
		if st, p := call(rq.method, rq.path, "key-alice-0123456789", rq.body); st != 503 || p.Code != api.CodeOperatorAPIDisabled || !strings.Contains(p.Detail, "--ops-nats-user") {
			t.Errorf("operator key on %s %s: %d %+v, want 503 operator_api_disabled naming --ops-nats-user", rq.method, rq.path, st, p)
		}
		if st, p := call(rq.method, rq.path, "key-acme-0123456789", rq.body); st != 403 || p.Code != api.CodeOperatorOnly {
			t.Errorf("client key on %s %s: %d %+v, want 403 operator_only", rq.method, rq.path, st, p)
		}
	}

	bad := cfg
	bad.Node, bad.OpsNATSUser, bad.OpsNATSPassword = 3, ou.Name, "wrong"
	if s, err := apid.Open(ctx, bad); err == nil {
		s.Close()
		t.Fatal("an API with a wrong operator password opened")
	} else if !strings.Contains(err.Error(), "operator user "+ou.Name) {
		t.Fatalf("wrong operator password: got %v, want an error naming %s", err, ou.Name)
	}
}
