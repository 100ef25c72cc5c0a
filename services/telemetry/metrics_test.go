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

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
)

// scrape sums a metric's samples whose labels match every given pair.
func scrape(tb testing.TB, url, name string, labels map[string]string) int64 {
	tb.Helper()
	var sum int64
	for _, s := range samples(tb, url, name) {
		ok := true
		for k, v := range labels {
			ok = ok && s.labels[k] == v
		}
		if ok {
			sum += int64(s.value)
		}
	}
	return sum
}

// sample is one sample of a scraped metric.
type sample struct {
	labels map[string]string
	value  float64
}

// samples returns every sample of a metric at url.
func samples(tb testing.TB, url, name string) []sample {
	tb.Helper()
	res, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	line := regexp.MustCompile(`(?m)^` + name + `\{([^}]*)\} (\S+)$`)
	label := regexp.MustCompile(`(\w+)="([^"]*)"`)
	var out []sample
	for _, m := range line.FindAllStringSubmatch(string(b), -1) {
		s := sample{labels: map[string]string{}}
		for _, l := range label.FindAllStringSubmatch(m[1], -1) {
			s.labels[l[1]] = l[2]
		}
		s.value, _ = strconv.ParseFloat(m[2], 64)
		out = append(out, s)
	}
	return out
}

// TestMetricsCountInjectedDuplicates runs transfers across three regions
// with a known number of forced redeliveries (dropped acks) and router
// re-publishes, then scrapes every region's /metrics: the duplicate
// counters per layer add up to what was injected (plus what a slow batch
// redelivered on its own), every duplicate carries
// a topic of the closed set, and each (region, topic) with duplicates has
// deliveries to divide them by.
func TestMetricsCountInjectedDuplicates(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu", "us", "ap")
	ctx := context.Background()
	var dropped, calls atomic.Int64
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: map[string]uint8{"eu": 1, "us": 2, "ap": 3}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_metrics_%d_", os.Getpid()), Shards: 4, BatchSize: 32, AckWait: time.Second,
		DropAck: func() bool {
			if calls.Add(1)%5 == 0 {
				dropped.Add(1)
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
		// Submitted in the destination's region, so that the transfer is
		// forwarded to its home (a submit in the home region skips it).
		if err := c.Submit(ctx, dst, ledger.Command{Type: ledger.TypeTransfer, TransferID: id, ClientID: "c", IdempotencyKey: fmt.Sprint("t-", i),
			From: accts[src], To: accts[dst], Amount: 1, Currency: "EUR", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitQuiet(wctx); err != nil {
		t.Fatal(err)
	}
	var ledgerDups, routerDups, injected, deliveries, redeliveries int64
	for _, r := range names {
		reg := c.Region(r)
		redeliveries += reg.Ledger.Stats.Redeliveries.Load()
		for _, layer := range []string{"recent_cache", "dedup_table"} {
			ledgerDups += scrape(t, reg.LedgerMetricsURL, "paymesh_duplicates_total", map[string]string{"region": r, "layer": layer})
		}
		routerDups += scrape(t, reg.RouterMetricsURL, "paymesh_router_duplicates_total", map[string]string{"region": r, "layer": "msg_id"})
		deliveries += scrape(t, reg.LedgerMetricsURL, "paymesh_deliveries_total", map[string]string{"region": r, "stream": reg.Ledger.Topo.Stream()})
		injected += reg.Injected()
	}
	if dropped.Load() == 0 || injected == 0 {
		t.Fatalf("nothing injected: dropped %d, re-published %d", dropped.Load(), injected)
	}
	// A loaded machine can make a batch outlast AckWait: that repeat is
	// caught too, though nobody forced it. So the ledger's catches are at
	// least the forced redeliveries and at most all redeliveries.
	if ledgerDups < dropped.Load() || ledgerDups > redeliveries {
		t.Errorf("ledger duplicates in /metrics: %d, want the %d redeliveries forced by dropped acks, plus at most the %d others",
			ledgerDups, dropped.Load(), redeliveries-dropped.Load())
	}
	if routerDups != injected {
		t.Errorf("router duplicates in /metrics: %d, want the %d re-publishes", routerDups, injected)
	}
	if deliveries < 150 {
		t.Errorf("deliveries in /metrics: %d", deliveries)
	}
	checkTopics(t, c, names)
}

// checkTopics checks the topic labels of the duplicate and delivery
// counters of every region.
func checkTopics(t *testing.T, c *cluster.Cluster, names []string) {
	t.Helper()
	ledgerTopics := map[string]bool{"transfer": true, "fund": true, "credit": true, "confirm": true, "refund": true,
		"capture": true, "void": true, "expire": true, "refund_request": true}
	routerTopics := map[string]bool{"route": true, "forward": true, "relay": true}
	for _, r := range names {
		url, routerURL := c.Region(r).LedgerMetricsURL, c.Region(r).RouterMetricsURL
		delivered := map[string]float64{}
		for _, s := range samples(t, url, "paymesh_deliveries_total") {
			delivered[s.labels["topic"]] += s.value
		}
		// Every region funded an account, sent transfers out (settled by a
		// confirm) and received credits.
		for _, topic := range []string{"transfer", "fund", "credit", "confirm"} {
			if delivered[topic] == 0 {
				t.Errorf("%s: no deliveries of topic %s: %v", r, topic, delivered)
			}
		}
		dups := map[string]float64{}
		for _, s := range samples(t, url, "paymesh_duplicates_total") {
			if !ledgerTopics[s.labels["topic"]] {
				t.Errorf("%s: paymesh_duplicates_total%v: topic not in %v", r, s.labels, ledgerTopics)
			}
			dups[s.labels["topic"]] += s.value
		}
		for topic, n := range dups {
			if n > 0 && delivered[topic] < n {
				t.Errorf("%s: %v duplicates of topic %s over %v deliveries", r, n, topic, delivered[topic])
			}
		}
		var routerDups float64
		for _, s := range samples(t, routerURL, "paymesh_router_duplicates_total") {
			if !routerTopics[s.labels["topic"]] {
				t.Errorf("%s: paymesh_router_duplicates_total%v: topic not in %v", r, s.labels, routerTopics)
			}
			routerDups += s.value
		}
		published := map[string]float64{}
		for _, name := range []string{"paymesh_router_submitted_total", "paymesh_router_forwarded_total", "paymesh_router_relayed_total"} {
			for _, s := range samples(t, routerURL, name) {
				published[s.labels["topic"]] += s.value
			}
		}
		for topic := range routerTopics {
			if published[topic] == 0 {
				t.Errorf("%s: no router publishes of topic %s: %v", r, topic, published)
			}
		}
		if routerDups == 0 {
			t.Errorf("%s: no router duplicates by topic", r)
		}
	}
}
