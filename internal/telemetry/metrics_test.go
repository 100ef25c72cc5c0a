package telemetry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/cluster"
	"github.com/paymesh/paymesh/internal/natsembed"
	"github.com/paymesh/paymesh/internal/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
)

// scrape sums a metric's samples whose labels match every given pair.
func scrape(tb testing.TB, url, name string, labels map[string]string) int64 {
	tb.Helper()
	res, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	line := regexp.MustCompile(`(?m)^` + name + `\{([^}]*)\} (\S+)$`)
	var sum int64
	for _, m := range line.FindAllStringSubmatch(string(b), -1) {
		ok := true
		for k, v := range labels {
			if !regexp.MustCompile(`(^|,)` + k + `="` + regexp.QuoteMeta(v) + `"`).MatchString(m[1]) {
				ok = false
			}
		}
		if ok {
			f, _ := strconv.ParseFloat(m[2], 64)
			sum += int64(f)
		}
	}
	return sum
}

// TestMetricsCountInjectedDuplicates runs transfers across three regions
// with a known number of forced redeliveries (dropped acks) and router
// re-publishes, then scrapes every region's /metrics: the duplicate
// counters per layer add up to what was injected.
func TestMetricsCountInjectedDuplicates(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu", "us", "ap")
	ctx := context.Background()
	var dropped, calls atomic.Int64
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: map[string]uint8{"eu": 1, "us": 2, "ap": 3}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_metrics_%d_", os.Getpid()), Shards: 4, BatchSize: 32, AckWait: time.Second,
		DropAck: func(msgs int) bool {
			if calls.Add(1)%5 == 0 {
				dropped.Add(int64(msgs))
				return true
			}
			return false
		},
		Inject: func() bool { return calls.Load()%3 == 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	names := []string{"eu", "us", "ap"}
	accts := map[string]string{}
	gen := map[string]*idgen.Generator{}
	for _, r := range names {
		gen[r], _ = idgen.NewGenerator(c.IDs(), r, 900)
		a, err := c.Region(r).Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		accts[r] = a.ID
		id, _ := gen[r].NextString()
		if err := c.Submit(ctx, r, ledger.Command{Type: ledger.TypeFund, TransferID: id, ClientID: "c", IdempotencyKey: "f-" + r,
			To: a.ID, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 150 {
		src, dst := names[i%3], names[(i+1)%3]
		id, _ := gen[src].NextString()
		if err := c.Submit(ctx, src, ledger.Command{Type: ledger.TypeTransfer, TransferID: id, ClientID: "c", IdempotencyKey: fmt.Sprint("t-", i),
			From: accts[src], To: accts[dst], Amount: 1, Currency: "EUR", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitQuiet(wctx); err != nil {
		t.Fatal(err)
	}
	var ledgerDups, routerDups, injected, deliveries int64
	for _, r := range names {
		reg := c.Region(r)
		for _, layer := range []string{"recent_cache", "dedup_table"} {
			ledgerDups += scrape(t, reg.LedgerMetricsURL, "paymesh_duplicates_total", map[string]string{"region": r, "layer": layer})
		}
		routerDups += scrape(t, reg.RouterMetricsURL, "paymesh_router_duplicates_total", map[string]string{"region": r, "layer": "msg_id"})
		deliveries += scrape(t, reg.LedgerMetricsURL, "paymesh_deliveries_total", map[string]string{"region": r, "stream": reg.Ledger.Topo.Stream()})
		injected += reg.Router.Stats().Injected.Load()
	}
	if dropped.Load() == 0 || injected == 0 {
		t.Fatalf("nothing injected: dropped %d, re-published %d", dropped.Load(), injected)
	}
	if ledgerDups != dropped.Load() {
		t.Errorf("ledger duplicates in /metrics: %d, want the %d redeliveries forced by dropped acks", ledgerDups, dropped.Load())
	}
	if routerDups != injected {
		t.Errorf("router duplicates in /metrics: %d, want the %d re-publishes", routerDups, injected)
	}
	if deliveries < 150 {
		t.Errorf("deliveries in /metrics: %d", deliveries)
	}
}
