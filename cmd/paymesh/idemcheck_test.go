package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/services/api"
)

// shippedIdemcheck is the kit's config for paymesh, as shipped.
var shippedIdemcheck = filepath.Join("..", "..", "deploy", "idemcheck", "paymesh.yaml")

// TestIdemcheckPaymesh: paymesh idemcheck with the shipped config, against
// two regions of a running paymesh (eu and us), passes every case it runs:
// the key's semantics hold under concurrency, a cut request and a retry in
// the other region, each checked on the transfers read back. The expiry
// (24 h) is skipped.
func TestIdemcheckPaymesh(t *testing.T) {
	ctx := context.Background()
	topo := natsembed.MustStartTopology(t, "eu", "us")
	c, err := cluster.Start(ctx, cluster.Config{Regions: map[string]uint8{"eu": 1, "us": 2}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_idem_%d_", os.Getpid()), Shards: 2, BatchSize: 64, AckWait: 2 * time.Second,
		APIWait: 3 * time.Second, KeyTTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	const key = "pm_idem_test_0123456789abcdef"
	for _, r := range []string{"eu", "us"} {
		if err := c.Region(r).APIStore.PutClient(ctx, api.RegisteredClient{ID: "idem", Name: "idem"}, key); err != nil {
			t.Fatal(err)
		}
	}
	from, to := openAccount(t, []string{"--api-url", c.Region("eu").APIURL, "--api-key", key}), openAccount(t, []string{"--api-url", c.Region("eu").APIURL, "--api-key", key})
	fundAccount(t, c, "eu", from, 1_000_000)
	t.Setenv("PAYMESH_API_KEY", key)
	t.Setenv("IDEMCHECK_FROM", from)
	t.Setenv("IDEMCHECK_TO", to)
	t.Setenv("IDEMCHECK_CURRENCY", "EUR")
	out, err := runCLI(t, "idemcheck", "--config", shippedIdemcheck, c.Region("eu").APIURL, c.Region("us").APIURL)
	if err != nil {
		t.Fatalf("idemcheck against paymesh: %v\n%s", err, out)
	}
	t.Log("\n" + out)
	for _, name := range []string{"missing_key", "key_too_long", "replay", "other_body", "in_flight", "concurrent", "timeout_retry", "other_region", "other_resource"} {
		if !strings.Contains(out, "PASS  "+name) {
			t.Errorf("%s did not PASS:\n%s", name, out)
		}
	}
	if !strings.Contains(out, "SKIP  expiry") || !strings.Contains(out, ": 9 PASS, 0 FAIL, 1 SKIP") {
		t.Errorf("want expiry skipped and 9 PASS:\n%s", out)
	}
}

// TestIdemcheckRefuses: a config or URL the kit cannot use exits 2 with
// the reason, before any request.
func TestIdemcheckRefuses(t *testing.T) {
	t.Setenv("PAYMESH_API_KEY", "k")
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"UnsetVariable", []string{"idemcheck", "--config", shippedIdemcheck, "http://127.0.0.1:1"}, "environment variables not set: IDEMCHECK_FROM, IDEMCHECK_TO, IDEMCHECK_CURRENCY"},
		{"BadURL", []string{"idemcheck", "--config", filepath.Join("..", "..", "pkg", "idemcheck", "testdata", "racyapi.yaml"), "127.0.0.1:8101"}, `URL "127.0.0.1:8101"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runCLI(t, tt.args...)
			var ec kong.ExitCoder
			if !errors.As(err, &ec) || ec.ExitCode() != 2 || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want exit 2 naming %q", err, tt.want)
			}
		})
	}
	if _, err := runCLI(t, "idemcheck", "--config", "none.yaml", "http://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("a config that does not exist: got %v, want a usage error naming it", err)
	}
}
