package promcheck_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/promcheck"
	"github.com/paymesh/paymesh/internal/testbed/promcheck/promchecktest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// scrapeTargets maps the compose config's scrape targets (<service>-<region>:port)
// to the cluster's metrics endpoints: each region's ledger, router and API
// serve their own /metrics, as deployed.
func scrapeTargets(c *cluster.Cluster) func(string) string {
	hostPort := func(u string) string {
		p, err := url.Parse(u)
		if err != nil {
			return ""
		}
		return p.Host
	}
	return func(target string) string {
		service, _, _ := strings.Cut(target, ":")
		kind, region, _ := strings.Cut(service, "-")
		r := c.Region(region)
		if r == nil {
			return ""
		}
		switch kind {
		case "ledger":
			return hostPort(r.LedgerMetricsURL)
		case "router":
			return hostPort(r.RouterMetricsURL)
		case "api":
			return hostPort(r.APIMetricsURL)
		}
		return ""
	}
}

// load drives a cluster: transfers through the routers (same-region and
// cross-region), transfers through the HTTP APIs sent twice with the same
// Idempotency-Key, and one cross-region transfer the destination refuses
// (so the refund stage exists).
type load struct {
	c      *cluster.Cluster
	names  []string
	eur    map[string]string // an EUR account per region
	other  map[string]string // another, the destination of same-region transfers
	usdUS  string            // a USD account in us: EUR credits to it are refused
	gen    map[string]*idgen.Generator
	apiKey string
	sent   atomic.Int64
	api    atomic.Int64
}

func newLoad(t *testing.T, c *cluster.Cluster, names []string) *load {
	t.Helper()
	ctx := context.Background()
	l := &load{c: c, names: names, eur: map[string]string{}, other: map[string]string{}, gen: map[string]*idgen.Generator{}, apiKey: "promcheck-key-0123456789"}
	for _, r := range names {
		store := c.Region(r).Ledger.Store
		if err := c.Region(r).APIStore.PutClient(ctx, api.RegisteredClient{ID: "c", Name: "c", RatePerSec: 10_000}, l.apiKey); err != nil {
			t.Fatal(err)
		}
		var err error
		if l.gen[r], err = idgen.NewGenerator(c.IDs(), r, 901); err != nil {
			t.Fatal(err)
		}
		a, _, err := store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		l.eur[r] = a.ID
		b, _, err := store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		l.other[r] = b.ID
		if err := c.Submit(ctx, r, ledger.Command{Type: ledger.TypeFund, TransferID: l.id(t, r), ClientID: "c", IdempotencyKey: "fund-" + r,
			To: a.ID, Amount: 100_000_000, Currency: "EUR", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	usd, _, err := c.Region("us").Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	l.usdUS = usd.ID
	return l
}

func (l *load) id(t *testing.T, region string) string {
	id, err := l.gen[region].NextString()
	if err != nil {
		t.Error(err)
	}
	return id
}

// transfer submits transfer i through the router of the region after its
// source's, so that it is forwarded (a submit in its home region skips the
// route stream).
func (l *load) transfer(ctx context.Context, t *testing.T, i int, to string) {
	src := l.names[i%len(l.names)]
	via := l.names[(i+1)%len(l.names)]
	err := l.c.Submit(ctx, via, ledger.Command{Type: ledger.TypeTransfer, TransferID: l.id(t, src), ClientID: "c",
		IdempotencyKey: fmt.Sprint("t-", i), From: l.eur[src], To: to, Amount: 1, Currency: "EUR", CreatedAt: time.Now()})
	if err != nil && ctx.Err() == nil {
		t.Errorf("submit %d: %v", i, err)
	}
	l.sent.Add(1)
}

// viaAPI posts transfer i to its source region's API twice with one key:
// the second answer is a replay.
func (l *load) viaAPI(ctx context.Context, t *testing.T, i int) {
	src, dst := l.names[i%len(l.names)], l.names[(i+1)%len(l.names)]
	cl := &api.Client{BaseURL: l.c.Region(src).APIURL, APIKey: l.apiKey}
	key := fmt.Sprint("api-", i)
	req := api.TransferRequest{From: l.eur[src], To: l.eur[dst], Amount: 1, Currency: "EUR"}
	for range 2 {
		if _, err := cl.SendTransfer(ctx, req, key); err != nil && ctx.Err() == nil {
			t.Errorf("api transfer %d: %v", i, err)
			return
		}
	}
	l.api.Add(1)
}

// run sends about rate transfers a second (a tenth through the APIs, every
// other one cross-region) until ctx ends or max were sent.
func (l *load) run(ctx context.Context, t *testing.T, rate, max int) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	l.transfer(ctx, t, 0, l.usdUS) // refused in us: refunded in eu
	for i := 1; i < max; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		switch {
		case i%10 == 0:
			l.viaAPI(ctx, t, i)
		case i%2 == 0:
			l.transfer(ctx, t, i, l.other[l.names[i%len(l.names)]]) // same region
		default:
			l.transfer(ctx, t, i, l.eur[l.names[(i+1)%len(l.names)]]) // cross-region
		}
	}
}

// TestEveryPanelHasData runs a three-region cluster under mixed load, first
// clean, then with injected duplicates (dropped acks and router
// re-publishes), scraped by a real Prometheus running the compose config
// and the alert rules. Every query of every dashboard panel returns data,
// the duplicate-age panels' queries return trace exemplars, and the
// duplicate-rate alert fires for a region and topic.
func TestEveryPanelHasData(t *testing.T) {
	promchecktest.Require(t)
	if testing.Short() {
		t.Skip("-short: a cluster under load for about 20s")
	}
	// Spans are sampled (and dropped: no exporter), so the duplicates'
	// ages carry their traces as exemplars, as with OTLP export on.
	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	names := []string{"eu", "us", "ap"}
	topo := natsembed.MustStartTopology(t, names...)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var faulty atomic.Bool
	var batches atomic.Int64
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: map[string]uint8{"eu": 1, "us": 2, "ap": 3}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_promcheck_%d_", os.Getpid()), Shards: 4, BatchSize: 32, AckWait: time.Second,
		DropAck: func() bool { return faulty.Load() && batches.Add(1)%3 == 0 },
		Inject:  func() bool { return faulty.Load() && batches.Load()%2 == 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	l := newLoad(t, c, names)

	prom, err := promcheck.Start(ctx, promcheck.Options{ConfigFile: configFile, Map: scrapeTargets(c),
		Dir: t.TempDir(), ScrapeInterval: time.Second, EvaluationInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer prom.Stop()
	t.Logf("prometheus at %s", prom.URL())

	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { l.run(loadCtx, t, 40, 2000) })
	defer func() { stopLoad(); wg.Wait() }()

	// Clean for a moment, then duplicates until every panel has data and
	// the duplicate alert fires (held for its 10s). There is no baseline
	// yet (it leaves the last 30s out), so the alert's floors decide.
	time.Sleep(2 * time.Second)
	faulty.Store(true)
	t.Logf("duplicates injected from now on")
	var (
		failures []promcheck.Failure
		noTraces []promcheck.Failure // duplicate-age queries without exemplars
		alerts   []promcheck.Alert
		dupAlert *promcheck.Alert
		topics   map[string]bool // the topics whose recorded duplicate ratio is above 0
	)
	// The alert needs 10 s of duplicates held; a loaded machine scrapes
	// and evaluates late: the loop ends as soon as everything is there.
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		if failures, err = prom.CheckPanels(ctx, dashboardFile); err != nil {
			t.Fatal(err)
		}
		if noTraces, err = prom.CheckExemplars(ctx, dashboardFile, ageMetric); err != nil {
			t.Fatal(err)
		}
		if alerts, err = prom.Alerts(ctx); err != nil {
			t.Fatal(err)
		}
		for _, a := range alerts {
			if a.Name == "PaymeshDuplicateRateHigh" && a.State == "firing" && dupAlert == nil {
				dupAlert = &a
			}
		}
		ratios, err := prom.Query(ctx, "paymesh:duplicate_ratio:rate30s > 0")
		if err != nil {
			t.Fatal(err)
		}
		topics = map[string]bool{}
		for _, s := range ratios {
			topics[s.Metric["topic"]] = true
		}
		if len(failures) == 0 && len(noTraces) == 0 && dupAlert != nil && topics["transfer"] && topics["forward"] {
			break
		}
	}
	for _, f := range append(failures, noTraces...) {
		t.Error(f)
	}
	checkExemplarsFail(ctx, t, prom)
	for _, a := range alerts {
		t.Logf("alert %s %s: region %s topic %s", a.Name, a.State, a.Labels["region"], a.Labels["topic"])
	}
	if dupAlert == nil {
		t.Error("PaymeshDuplicateRateHigh never fired under injected duplicates")
	} else {
		t.Logf("%s %s: region %s topic %s: %s", dupAlert.Name, dupAlert.State, dupAlert.Labels["region"], dupAlert.Labels["topic"],
			dupAlert.Annotations["description"])
		if dupAlert.Labels["region"] == "" || dupAlert.Labels["topic"] == "" || dupAlert.Labels["severity"] == "" {
			t.Errorf("alert labels %v: want region, topic and severity", dupAlert.Labels)
		}
	}
	// The load is valid: nothing went to a dead-letter stream.
	if dl, err := prom.Query(ctx, "sum(paymesh_dead_letters_total) > 0"); err != nil || len(dl) > 0 {
		t.Errorf("dead letters: %v (%v), want none", dl, err)
	}
	t.Logf("%d router transfers, %d API transfers sent twice; duplicate ratio above 0 on topics %v", l.sent.Load(), l.api.Load(), topics)
	if !topics["transfer"] || !topics["forward"] {
		t.Errorf("recorded duplicate ratio above 0 on topics %v, want at least transfer (ledger) and forward (router)", topics)
	}
}

// checkExemplarsFail: the exemplar check fails on a dashboard whose
// duplicate-age targets do not ask for exemplars, and on a query whose
// series keep none.
func checkExemplarsFail(ctx context.Context, t *testing.T, prom *promcheck.Server) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	off := filepath.Join(t.TempDir(), "exemplars-off.json")
	if err := os.WriteFile(off, []byte(strings.ReplaceAll(string(b), `"exemplar": true`, `"exemplar": false`)), 0o644); err != nil {
		t.Fatal(err)
	}
	qs, err := promcheck.MetricQueries(off, ageMetric)
	if err != nil {
		t.Fatal(err)
	}
	got, err := prom.CheckExemplars(ctx, off, ageMetric)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(qs) {
		t.Errorf("exemplars off: %d failures %v, want one per duplicate-age query (%d)", len(got), got, len(qs))
	}
	for _, f := range got {
		if !errors.Is(f.Err, promcheck.ErrExemplarOff) {
			t.Errorf("exemplars off: %v, want %v", f, promcheck.ErrExemplarOff)
		}
	}
	// Series a of testdata/dashboard.json does not exist: no exemplars.
	got, err = prom.CheckExemplars(ctx, "testdata/dashboard.json", "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !errors.Is(got[0].Err, promcheck.ErrNoExemplars) {
		t.Errorf("series without exemplars: got %v, want one failure: %v", got, promcheck.ErrNoExemplars)
	}
}
