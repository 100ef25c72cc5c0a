package cluster_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
)

// openMetrics scrapes url asking for OpenMetrics, the format that carries
// exemplars.
func openMetrics(tb testing.TB, url string) string {
	tb.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// exemplarTraces returns the trace ids of the exemplars on metric name's
// series with the given region.
func exemplarTraces(body, name, region string) []string {
	re := regexp.MustCompile(`(?m)^` + name + `\{[^}]*region="` + region + `"[^}]*\} \S+ # \{[^}]*trace_id="([0-9a-f]{32})"`)
	var ids []string
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// TestSagaStageMetrics: cross-region transfers that settle and transfers
// refunded because their destination does not exist show in /metrics as
// saga stage histograms, one count per transfer and stage in the region
// where the stage ended, however often its step was delivered; the
// histograms carry the transfers' traces as exemplars in an OpenMetrics
// scrape, and so do the apply histograms.
func TestSagaStageMetrics(t *testing.T) {
	rec := recorder() // spans are sampled, so measurements keep exemplars
	// Dropped acks: steps delivered again must count once.
	h := mustCluster(t, nil, rate(5, 0.3))
	h.open(t, 1, 1000)
	h.quiet(t, time.Minute)
	ctx := context.Background()
	send := func(n int, from, to string) {
		for range n {
			if err := h.c.Submit(ctx, "eu", h.transfer(t, from, to, 10)); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(3, h.accts["eu"][0], h.accts["us"][0]) // credit in us, settle in eu
	send(2, h.accts["us"][0], h.accts["ap"][0]) // credit in ap, settle in us
	send(2, h.accts["eu"][0], h.id(t, "ap"))    // refused credit in ap, refund in eu
	h.quiet(t, time.Minute)

	want := map[string]map[string]int64{
		"eu": {ledger.StageSettle: 3, ledger.StageRefund: 2},
		"us": {ledger.StageCredit: 3, ledger.StageSettle: 2},
		"ap": {ledger.StageCredit: 4},
	}
	traces := map[string]bool{}
	for _, s := range rec.Ended() {
		traces[s.SpanContext().TraceID().String()] = true
	}
	for region, stages := range want {
		body := openMetrics(t, h.c.Region(region).LedgerMetricsURL)
		for _, stage := range []string{ledger.StageCredit, ledger.StageSettle, ledger.StageRefund} {
			count := regexp.MustCompile(`(?m)^paymesh_saga_stage_duration_seconds_count\{region="` + region + `",stage="` + stage + `"\} (\S+)$`).FindStringSubmatch(body)
			var got int64
			if count != nil {
				got, _ = strconv.ParseInt(count[1], 10, 64)
			}
			if got != stages[stage] {
				t.Errorf("%s: %s stage count %d, want %d", region, stage, got, stages[stage])
			}
		}
		for _, name := range []string{"paymesh_saga_stage_duration_seconds_bucket", "paymesh_apply_duration_seconds_bucket", "paymesh_apply_batch_size_bucket",
			"paymesh_apply_commit_duration_seconds_bucket", "paymesh_apply_wait_seconds_bucket"} {
			ids := exemplarTraces(body, name, region)
			if len(ids) == 0 {
				t.Errorf("%s: no trace exemplar on %s", region, name)
			}
			for _, id := range ids {
				if !traces[id] {
					t.Errorf("%s: exemplar on %s names trace %s, which no recorded span has", region, name, id)
				}
			}
		}
	}
}

// TestMetricsPerService: each service of a region serves its own /metrics,
// as deployed, and a restarted region serves them at the same addresses
// with its counters kept.
func TestMetricsPerService(t *testing.T) {
	h := mustCluster(t, nil, nil)
	h.open(t, 2, 100) // funded by each region's operator, not through its router
	for range 2 {
		if err := h.c.Submit(context.Background(), "eu", h.transfer(t, h.accts["eu"][0], h.accts["eu"][1], 1)); err != nil {
			t.Fatal(err)
		}
	}
	h.quiet(t, time.Minute)
	submitted := `paymesh_router_submitted_total{region="eu",topic="route"} 2`
	check := func(r *cluster.Region) {
		t.Helper()
		for url, want := range map[string]string{
			r.LedgerMetricsURL: `paymesh_transfers_applied_total{consumer="ledger",region="eu",stream="LEDGER_EU"}`,
			r.RouterMetricsURL: submitted,
			r.APIMetricsURL:    `paymesh_idempotency_keys_total{cause="client_retry",layer="idempotency_key",outcome="replay",region="eu",topic="transfer"}`,
		} {
			if body := openMetrics(t, url); !strings.Contains(body, want) {
				t.Errorf("%s: no %s in\n%s", url, want, body)
			}
		}
		if r.LedgerMetricsURL == r.RouterMetricsURL || r.RouterMetricsURL == r.APIMetricsURL || r.LedgerMetricsURL == r.APIMetricsURL {
			t.Errorf("services share a /metrics: ledger %s, router %s, api %s", r.LedgerMetricsURL, r.RouterMetricsURL, r.APIMetricsURL)
		}
	}
	before := h.c.Region("eu")
	check(before)
	if err := h.c.RestartRegion(context.Background(), "eu"); err != nil {
		t.Fatal(err)
	}
	after := h.c.Region("eu")
	if after.LedgerMetricsURL != before.LedgerMetricsURL || after.RouterMetricsURL != before.RouterMetricsURL || after.APIMetricsURL != before.APIMetricsURL || after.APIURL != before.APIURL {
		t.Errorf("restart moved the endpoints: before %+v, after %+v", []string{before.APIURL, before.LedgerMetricsURL, before.RouterMetricsURL, before.APIMetricsURL},
			[]string{after.APIURL, after.LedgerMetricsURL, after.RouterMetricsURL, after.APIMetricsURL})
	}
	check(after)
}

// TestMetricsCountInjectedDuplicates runs transfers across three regions
// with a known number of forced redeliveries (dropped acks) and router
// re-publishes, then scrapes every region's /metrics: the duplicate
// counters per layer add up to what was injected (plus what a slow batch
// redelivered on its own), every duplicate carries
// a topic of the closed set, and each (region, topic) with duplicates has
// deliveries to divide them by.
func TestMetricsCountInjectedDuplicates(t *testing.T) {
	rec := recorder() // spans are sampled, so the duplicates' ages keep exemplars
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
		// The relays send the saga steps, so that their re-sends are
		// among the publishes injected twice.
		Ledger: func(_ string, lc *ledgerd.Config) { lc.RelaySteps = true },
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
		a, _, err := c.Region(r).Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
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
			ledgerDups += scrape.Sum(t, reg.LedgerMetricsURL, "paymesh_duplicates_total", map[string]string{"region": r, "layer": layer})
		}
		routerDups += scrape.Sum(t, reg.RouterMetricsURL, "paymesh_router_duplicates_total", map[string]string{"region": r, "layer": "msg_id"})
		deliveries += scrape.Sum(t, reg.LedgerMetricsURL, "paymesh_deliveries_total", map[string]string{"region": r, "stream": reg.Ledger.Topo.Stream()})
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
	checkCauses(t, c, names, rec)
}

// checkCauses checks the causes and ages of the duplicates that
// TestMetricsCountInjectedDuplicates injected: the ledger's are
// redeliveries (its acks dropped), the routers' re-publishes of forwards
// and re-sends of saga steps (a second copy, its attempt one higher);
// each counted duplicate has its age recorded, with its trace as an
// exemplar.
func checkCauses(t *testing.T, c *cluster.Cluster, names []string, rec interface {
	Ended() []sdktrace.ReadOnlySpan
}) {
	t.Helper()
	traces := map[string]bool{}
	for _, s := range rec.Ended() {
		traces[s.SpanContext().TraceID().String()] = true
	}
	var steps, forwards int64
	byCause := map[string]float64{}
	for _, r := range names {
		reg := c.Region(r)
		steps += reg.InjectedSteps()
		forwards += reg.Injected() - reg.InjectedSteps()
		counted := map[string]float64{}
		for service, url := range map[string]string{"ledger": reg.LedgerMetricsURL, "router": reg.RouterMetricsURL} {
			name := "paymesh_duplicates_total"
			if service == "router" {
				name = "paymesh_router_duplicates_total"
			}
			for _, s := range scrape.Samples(t, url, name) {
				byCause[service+" "+s.Labels["cause"]] += s.Value
				counted[service] += s.Value
			}
			aged := float64(scrape.Sum(t, url, "paymesh_duplicate_age_seconds_count", map[string]string{"region": r, "service": service}))
			if aged != counted[service] {
				t.Errorf("%s %s: %v duplicates have an age recorded, want all %v counted", r, service, aged, counted[service])
			}
			if counted[service] == 0 {
				continue
			}
			ids := exemplarTraces(openMetrics(t, url), "paymesh_duplicate_age_seconds_bucket", r)
			if len(ids) == 0 {
				t.Errorf("%s %s: no trace exemplar on paymesh_duplicate_age_seconds", r, service)
			}
			for _, id := range ids {
				if !traces[id] {
					t.Errorf("%s %s: an exemplar names trace %s, which no recorded span has", r, service, id)
				}
			}
		}
	}
	want := map[string]float64{"router republish": float64(forwards), "router saga_resend": float64(steps)}
	for k, n := range byCause {
		if strings.HasPrefix(k, "ledger ") && k != "ledger redelivery" && n > 0 {
			t.Errorf("ledger duplicates of cause %s: %v, want only redeliveries (acks dropped)", strings.TrimPrefix(k, "ledger "), n)
		}
		if strings.HasPrefix(k, "router ") && n != want[k] {
			t.Errorf("%s duplicates: %v, want %v", k, n, want[k])
		}
	}
	if byCause["ledger redelivery"] == 0 || forwards == 0 || steps == 0 {
		t.Errorf("causes %v: want redeliveries, and re-published forwards (%d) and saga steps (%d)", byCause, forwards, steps)
	}
}

// checkTopics checks the topic labels of the duplicate and delivery
// counters of every region.
func checkTopics(t *testing.T, c *cluster.Cluster, names []string) {
	t.Helper()
	ledgerTopics := map[string]bool{"transfer": true, "fund": true, "credit": true, "confirm": true, "refund": true,
		"capture": true, "void": true, "expire": true, "refund_request": true, "account": true}
	routerTopics := map[string]bool{"route": true, "forward": true, "relay": true}
	for _, r := range names {
		url, routerURL := c.Region(r).LedgerMetricsURL, c.Region(r).RouterMetricsURL
		delivered := map[string]float64{}
		for _, s := range scrape.Samples(t, url, "paymesh_deliveries_total") {
			delivered[s.Labels["topic"]] += s.Value
		}
		// Every region funded an account, sent transfers out (settled by a
		// confirm) and received credits.
		for _, topic := range []string{"transfer", "fund", "credit", "confirm"} {
			if delivered[topic] == 0 {
				t.Errorf("%s: no deliveries of topic %s: %v", r, topic, delivered)
			}
		}
		dups := map[string]float64{}
		for _, s := range scrape.Samples(t, url, "paymesh_duplicates_total") {
			if !ledgerTopics[s.Labels["topic"]] {
				t.Errorf("%s: paymesh_duplicates_total%v: topic not in %v", r, s.Labels, ledgerTopics)
			}
			dups[s.Labels["topic"]] += s.Value
		}
		for topic, n := range dups {
			if n > 0 && delivered[topic] < n {
				t.Errorf("%s: %v duplicates of topic %s over %v deliveries", r, n, topic, delivered[topic])
			}
		}
		var routerDups float64
		for _, s := range scrape.Samples(t, routerURL, "paymesh_router_duplicates_total") {
			if !routerTopics[s.Labels["topic"]] {
				t.Errorf("%s: paymesh_router_duplicates_total%v: topic not in %v", r, s.Labels, routerTopics)
			}
			routerDups += s.Value
		}
		published := map[string]float64{}
		for _, name := range []string{"paymesh_router_submitted_total", "paymesh_router_forwarded_total", "paymesh_router_relayed_total"} {
			for _, s := range scrape.Samples(t, routerURL, name) {
				published[s.Labels["topic"]] += s.Value
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
