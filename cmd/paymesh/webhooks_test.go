package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestWebhooksCommands: paymesh webhooks create, list, show, attempts,
// rotate, redeliver and delete, against a region whose operator allowed
// loopback; a URL the guard refuses is the API's 400.
func TestWebhooksCommands(t *testing.T) {
	ctx := context.Background()
	topo := natsembed.MustStartTopology(t, "eu")
	c, err := cluster.Start(ctx, cluster.Config{Regions: map[string]uint8{"eu": 1}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_clihooks_%d_", os.Getpid()), Shards: 2, BatchSize: 64, AckWait: 2 * time.Second,
		APIWait: 3 * time.Second, KeyTTL: time.Hour, API: func(_ string, a *apid.Config) { a.WebhookAllowHosts = []string{"127.0.0.1"} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	const key = "pm_cli_test_hooks_0123456789abcdef"
	if err := c.Region("eu").APIStore.PutClient(ctx, api.RegisteredClient{ID: "cli", Name: "cli"}, key); err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.Add(1) }))
	t.Cleanup(srv.Close)
	flags := []string{"--api-url", c.Region("eu").APIURL, "--api-key", key}
	run := func(args ...string) (string, error) { return runCLI(t, append(args, flags...)...) }

	out, err := run("webhooks", "create", "https://10.9.8.7/in")
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeInvalidRequest)) {
		t.Fatalf("webhooks create of a private address: %v %s, want the API's 400", err, out)
	}
	secretFile := filepath.Join(t.TempDir(), "secret")
	out, err = run("webhooks", "create", srv.URL+"/in", "--type", "account.opened", "--key", "cli-hook", "--secret-file", secretFile)
	var ep api.WebhookEndpointBody
	if err != nil || json.Unmarshal([]byte(out), &ep) != nil || ep.Secret == "" || len(ep.Types) != 1 {
		t.Fatalf("webhooks create: %v %s", err, out)
	}
	if b, err := os.ReadFile(secretFile); err != nil || string(b) != ep.Secret+"\n" {
		t.Fatalf("the secret file: %q %v, want the secret shown", b, err)
	}
	if fi, err := os.Stat(secretFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the secret file's mode: %v %v, want 0600", fi.Mode(), err)
	}
	out, err = run("webhooks", "list")
	if err != nil || !strings.Contains(out, ep.ID) || strings.Contains(out, ep.Secret) {
		t.Fatalf("webhooks list: %v %s, want the endpoint without its secret", err, out)
	}
	out, err = run("accounts", "create", "--currency", "EUR")
	var a api.AccountBody
	if err != nil || json.Unmarshal([]byte(out), &a) != nil {
		t.Fatalf("accounts create: %v %s", err, out)
	}
	for deadline := time.Now().Add(time.Minute); got.Load() == 0; time.Sleep(25 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the account's opening was never delivered")
		}
	}
	event := api.EventID(a.ID, 1)
	var al api.AttemptList
	for deadline := time.Now().Add(time.Minute); len(al.Attempts) == 0; time.Sleep(25 * time.Millisecond) {
		out, err = run("webhooks", "attempts", ep.ID, "--event", event)
		if err != nil || json.Unmarshal([]byte(out), &al) != nil || time.Now().After(deadline) {
			t.Fatalf("webhooks attempts: %v %s", err, out)
		}
	}
	if al.Attempts[0].StatusCode != http.StatusOK {
		t.Errorf("attempts: %+v, want one answered 200", al.Attempts)
	}
	if out, err = run("webhooks", "redeliver", event); err != nil || !strings.Contains(out, ep.ID) {
		t.Fatalf("webhooks redeliver: %v %s", err, out)
	}
	for deadline := time.Now().Add(time.Minute); got.Load() < 2; time.Sleep(25 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the redelivery never came")
		}
	}
	var rotated api.WebhookEndpointBody
	if out, err = run("webhooks", "rotate", ep.ID); err != nil || json.Unmarshal([]byte(out), &rotated) != nil || rotated.Secret == ep.Secret {
		t.Fatalf("webhooks rotate: %v %s", err, out)
	}
	if out, err = run("webhooks", "delete", ep.ID); err != nil || !strings.Contains(out, `"deleted"`) {
		t.Fatalf("webhooks delete: %v %s", err, out)
	}
	if out, err = run("webhooks", "show", ep.ID); !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeNotFound)) {
		t.Fatalf("webhooks show after delete: %v %s, want the API's 404", err, out)
	}
}
