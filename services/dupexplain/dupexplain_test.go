package dupexplain_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/promcheck"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/services/dupexplain"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestExplain runs two regions with duplicates of known causes (every
// fourth ack dropped: redeliveries; every third publish of a router sent
// twice: re-publishes and saga steps sent again), scraped by a real
// Prometheus with exemplars kept, and explains eu's duplicates from it:
// the causes and their counts agree with what eu's services counted, the
// most frequent first, each with its layers and ages, and the traces it
// names are traces of eu's duplicates.
func TestExplain(t *testing.T) {
	if err := promcheck.Installed(); err != nil {
		if os.Getenv("PAYMESH_REQUIRE_PROMETHEUS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(natstrace.IDGenerator{})))
	c := startRegions(t)
	prom := startPrometheus(t, c.Region("eu"))
	waitUp(t, prom)
	sendTransfers(t, c)
	ctx := context.Background()

	truth := counted(t, c.Region("eu"))
	if truth[string(ledger.CauseRedelivery)] == 0 || truth[string(ledger.CauseRepublish)]+truth[string(ledger.CauseSagaResend)] == 0 {
		t.Fatalf("eu's services counted %v: want redeliveries and re-publishes", truth)
	}
	waitScraped(t, prom, truth)

	rep, err := dupexplain.Explain(ctx, dupexplain.Config{Prometheus: prom.URL(), Region: "eu", Since: 10 * time.Minute, Traces: 3})
	if err != nil {
		t.Fatal(err)
	}
	checkCauses(t, rep, truth, counted(t, c.Region("eu")))
	var out strings.Builder
	rep.Print(&out, "http://jaeger.example:16686")
	t.Logf("\n%s", out.String())
	if !strings.Contains(rep.TraceSource, "exemplars") || len(rep.Traces) == 0 || len(rep.Traces) > 3 {
		t.Fatalf("traces %+v from %q: want 1 to 3, from the exemplars", rep.Traces, rep.TraceSource)
	}
	dups := duplicateTraces(rec, "eu")
	for _, tr := range rep.Traces {
		if !dups[tr.ID] || tr.Cause == "" || tr.Layer == "" {
			t.Errorf("trace %+v: not a trace of a duplicate caught in eu (or no cause and layer)", tr)
		}
		if !strings.Contains(out.String(), "http://jaeger.example:16686/trace/"+tr.ID) {
			t.Errorf("the report does not link trace %s to Jaeger:\n%s", tr.ID, out.String())
		}
	}
}

// counted returns the duplicates region's services counted, by cause.
func counted(t *testing.T, r *cluster.Region) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range []struct{ url, name string }{{r.LedgerMetricsURL, "paymesh_duplicates_total"},
		{r.RouterMetricsURL, "paymesh_router_duplicates_total"}, {r.APIMetricsURL, "paymesh_idempotency_keys_total"}} {
		for _, s := range scrape.Samples(t, m.url, m.name) {
			if s.Labels["outcome"] == "" || s.Labels["outcome"] == "replay" {
				out[s.Labels["cause"]] += s.Value
			}
		}
	}
	return out
}

// checkCauses: every cause the services counted is in the report, between
// what they had counted when Prometheus had it all (before) and what they
// count now (after: a late redelivery), most first, with its layers and
// ages.
func checkCauses(t *testing.T, rep dupexplain.Report, before, after map[string]float64) {
	t.Helper()
	got := map[string]dupexplain.Cause{}
	for i, c := range rep.Causes {
		got[c.Cause] = c
		if i > 0 && c.Count > rep.Causes[i-1].Count {
			t.Errorf("causes not most first: %+v", rep.Causes)
		}
	}
	for cause, n := range after {
		if n == 0 {
			continue
		}
		c, ok := got[cause]
		if !ok || c.Count < before[cause] || c.Count > n {
			t.Errorf("cause %s: %+v, want %v to %v (what eu's services counted)", cause, c, before[cause], n)
			continue
		}
		if len(c.Layers) == 0 || math.IsNaN(c.AgeP50) || c.AgeP99 < c.AgeP50 || c.AgeP999 < c.AgeP99 {
			t.Errorf("cause %s: %+v, want its layers and ages", cause, c)
		}
	}
	if rep.Deliveries <= rep.Duplicates {
		t.Errorf("deliveries %v, duplicates %v: want the duplicates a share of the deliveries", rep.Deliveries, rep.Duplicates)
	}
}

// TestExplainRefuses: a bad configuration and a Prometheus that cannot be
// read are errors, named.
func TestExplainRefuses(t *testing.T) {
	ctx := context.Background()
	for name, cfg := range map[string]dupexplain.Config{
		"NoPrometheus": {Region: "eu", Since: time.Minute},
		"NoRegion":     {Prometheus: "http://127.0.0.1:1", Since: time.Minute},
		"NoWindow":     {Prometheus: "http://127.0.0.1:1", Region: "eu"},
		"BadRegion":    {Prometheus: "http://127.0.0.1:1", Region: `eu"}`, Since: time.Minute},
	} {
		if _, err := dupexplain.Explain(ctx, cfg); !errors.Is(err, dupexplain.ErrConfig) {
			t.Errorf("%s: got %v, want ErrConfig", name, err)
		}
	}
	if _, err := dupexplain.Explain(ctx, dupexplain.Config{Prometheus: "http://127.0.0.1:1", Region: "eu", Since: time.Minute}); !errors.Is(err, dupexplain.ErrQuery) {
		t.Errorf("unreachable Prometheus: got %v, want ErrQuery", err)
	}
}

// startRegions runs eu and us with duplicates injected: every fourth ack
// dropped, every third publish of a router sent twice.
func startRegions(t *testing.T) *cluster.Cluster {
	t.Helper()
	topo := natsembed.MustStartTopology(t, "eu", "us")
	var calls atomic.Int64
	c, err := cluster.Start(context.Background(), cluster.Config{
		Regions: map[string]uint8{"eu": 1, "us": 2}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_dupexplain_%d_", os.Getpid()), Shards: 2, BatchSize: 16, AckWait: time.Second,
		DropAck: func() bool { return calls.Add(1)%4 == 0 },
		Inject:  func() bool { return calls.Load()%3 == 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	return c
}

// sendTransfers funds an account in each region, sends transfers both
// ways, and waits until they have settled.
func sendTransfers(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	accts := map[string]string{}
	gens := map[string]*idgen.Generator{}
	for _, r := range []string{"eu", "us"} {
		gens[r], _ = idgen.NewGenerator(c.IDs(), r, 901)
		a, _, err := c.Region(r).Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		accts[r] = a.ID
		id, _ := gens[r].NextString()
		if err := c.Submit(ctx, r, ledger.Command{Type: ledger.TypeFund, TransferID: id, ClientID: "c", IdempotencyKey: "f-" + r,
			To: a.ID, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 80 {
		src, dst := "eu", "us"
		if i%2 == 1 {
			src, dst = dst, src
		}
		id, _ := gens[src].NextString()
		if err := c.Submit(ctx, dst, ledger.Command{Type: ledger.TypeTransfer, TransferID: id, ClientID: "c", IdempotencyKey: fmt.Sprint("t-", i),
			From: accts[src], To: accts[dst], Amount: 1, Currency: "EUR", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.WaitQuiet(wctx); err != nil {
		t.Fatal(err)
	}
}

// waitUp waits until Prometheus has scraped each of its targets once (the
// counters' zeros, before any duplicate).
func waitUp(t *testing.T, prom *promcheck.Server) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		samples, err := prom.Query(context.Background(), `count(up == 1)`)
		if err == nil && len(samples) == 1 && samples[0].Value == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not scrape the 3 services within a minute: %v %v", samples, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startPrometheus runs Prometheus scraping region's three services every
// second.
func startPrometheus(t *testing.T, r *cluster.Region) *promcheck.Server {
	t.Helper()
	var targets []string
	for _, u := range []string{r.LedgerMetricsURL, r.RouterMetricsURL, r.APIMetricsURL} {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, `"`+parsed.Host+`"`)
	}
	cfg := filepath.Join(t.TempDir(), "prometheus.yml")
	body := "scrape_configs:\n  - job_name: paymesh\n    static_configs:\n      - targets: [" + strings.Join(targets, ", ") + "]\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := promcheck.Start(context.Background(), promcheck.Options{ConfigFile: cfg, ScrapeInterval: time.Second, EvaluationInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// waitScraped waits until Prometheus holds the counts the services show.
func waitScraped(t *testing.T, prom *promcheck.Server, truth map[string]float64) {
	t.Helper()
	var total float64
	for _, n := range truth {
		total += n
	}
	deadline := time.Now().Add(time.Minute)
	for {
		samples, err := prom.Query(context.Background(), `sum(paymesh_duplicates_total{region="eu"}) + sum(paymesh_router_duplicates_total{region="eu"})`)
		if err == nil && len(samples) == 1 && samples[0].Value >= total {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not scrape the %v duplicates within a minute: %v %v", total, samples, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// duplicateTraces returns the traces with a span of region that caught a
// duplicate.
func duplicateTraces(rec *tracetest.SpanRecorder, region string) map[string]bool {
	out := map[string]bool{}
	for _, s := range rec.Ended() {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["paymesh.dedup.outcome"] == "duplicate" && attrs["paymesh.region"] == region {
			out[s.SpanContext().TraceID().String()] = true
		}
	}
	return out
}
