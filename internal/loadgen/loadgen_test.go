package loadgen_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/cluster"
	"github.com/paymesh/paymesh/internal/loadgen"
	"github.com/paymesh/paymesh/internal/natsembed"
	"github.com/paymesh/paymesh/internal/pgtest"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// TestLoad drives transfers through the three regions' APIs and checks that
// every retry was answered as a replay and the ledgers stay consistent.
func TestLoad(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu", "us", "ap")
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: map[string]uint8{"eu": 1, "us": 2, "ap": 3}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_load_%d_", os.Getpid()), Shards: 4, BatchSize: 64, AckWait: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	for _, s := range c.Stores() {
		if err := s.PutClient(ctx, postgres.Client{ID: "load", Name: "load", RatePerSec: 10_000, MaxOverdraft: 1_000_000}, "load-key-0123456789"); err != nil {
			t.Fatal(err)
		}
	}
	apis := map[string]string{}
	for _, n := range c.Names() {
		apis[n] = c.Region(n).APIURL
	}
	res, err := loadgen.Run(ctx, loadgen.Config{APIs: apis, APIKey: "load-key-0123456789", Accounts: 3, Overdraft: 1_000_000,
		Transfers: 150, Concurrency: 8, Retry: 0.3, Seed: 5}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	res.Print(io.Discard)
	if res.Sent < 100 || res.Retries == 0 || res.Replayed != res.Retries || len(res.Refused) != 0 {
		t.Fatalf("result %+v: want every retry replayed and nothing refused", res)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitQuiet(wctx); err != nil {
		t.Fatal(err)
	}
	rep, err := postgres.VerifyGlobal(ctx, c.Stores(), true)
	if err != nil || !rep.OK() {
		t.Fatalf("global verify: %v\n%s", err, rep)
	}
}
