package loadgen_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/lab/loadgen"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/services/api"
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
	for _, s := range c.APIStores() {
		if err := s.PutClient(ctx, api.RegisteredClient{ID: "load", Name: "load", RatePerSec: 10_000, MaxOverdraft: 1_000_000}, "load-key-0123456789"); err != nil {
			t.Fatal(err)
		}
	}
	apis := map[string]string{}
	for _, n := range c.Names() {
		apis[n] = c.Region(n).APIURL
	}
	var history bytes.Buffer
	res, err := loadgen.Run(ctx, loadgen.Config{APIs: apis, APIKey: "load-key-0123456789", Accounts: 3, Overdraft: 1_000_000,
		Transfers: 150, Concurrency: 8, Retry: 0.3, Cross: 0.5, History: &history, Client: "load", Seed: 5}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	res.Print(io.Discard)
	if res.Sent != 150 || res.Retries == 0 || res.Replayed != res.Retries || len(res.Refused) != 0 || len(res.Failed) != 0 {
		t.Fatalf("result %+v: want every transfer sent, every retry replayed and nothing refused", res)
	}
	entries, err := loadgen.ReadHistory(&history)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(entries)) != res.Sent+res.Retries {
		t.Fatalf("history has %d entries, want %d (sent plus retries)", len(entries), res.Sent+res.Retries)
	}
	cross := 0
	for _, e := range entries {
		from, _ := c.IDs().HomeRegion(e.From)
		to, _ := c.IDs().HomeRegion(e.To)
		if from != to {
			cross++
		}
		if e.Key == "" || e.TransferID == "" || e.Client != "load" || (e.Status != 201 && e.Status != 202) || apis[e.Region] == "" {
			t.Fatalf("history entry %+v: want a key, a transfer id, the client, 201 or 202 and a region asked", e)
		}
	}
	if cross < len(entries)/4 || cross > 3*len(entries)/4 {
		t.Fatalf("%d of %d transfers cross-region, want about half", cross, len(entries))
	}
	// Duration ends the sending before Transfers.
	begin := time.Now()
	sctx, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	short, err := loadgen.Run(sctx, loadgen.Config{APIs: apis, APIKey: "load-key-0123456789", Accounts: 2, Overdraft: 1_000_000,
		Transfers: 1_000_000, Concurrency: 4, Duration: time.Second, Seed: 6}, io.Discard)
	if err != nil {
		t.Fatalf("a 1s load: %v after %s", err, time.Since(begin))
	}
	if short.Sent == 0 || short.Sent >= 1_000_000 {
		t.Fatalf("a 1s load sent %d transfers in %s: want some, stopped by the duration", short.Sent, time.Since(begin))
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

// TestBadConfig: shares outside 0..1 are refused before anything is sent.
func TestBadConfig(t *testing.T) {
	for _, cfg := range []loadgen.Config{
		{APIs: map[string]string{"eu": "http://127.0.0.1:1"}, Accounts: 2, Cross: 1.5},
		{APIs: map[string]string{"eu": "http://127.0.0.1:1"}, Accounts: 2, Retry: -0.1},
		{APIs: map[string]string{"eu": "http://127.0.0.1:1"}, Accounts: 2, Cross: 0.5},
	} {
		if _, err := loadgen.Run(context.Background(), cfg, io.Discard); err == nil {
			t.Errorf("Run(%+v): got no error, want one", cfg)
		}
	}
}

// TestReadHistoryBadLine names the line that does not decode.
func TestReadHistoryBadLine(t *testing.T) {
	_, err := loadgen.ReadHistory(strings.NewReader("{\"key\":\"a\"}\n{oops\n"))
	if err == nil || !strings.Contains(err.Error(), "entry 2") {
		t.Fatalf("got %v, want an error naming entry 2", err)
	}
}
