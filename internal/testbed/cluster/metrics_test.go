package cluster_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/ledger"
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
		for _, name := range []string{"paymesh_saga_stage_duration_seconds_bucket", "paymesh_apply_duration_seconds_bucket", "paymesh_apply_batch_size_bucket"} {
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
	h.open(t, 2, 100)
	h.quiet(t, time.Minute)
	submitted := `paymesh_router_submitted_total{region="eu",topic="route"} 2`
	check := func(r *cluster.Region) {
		t.Helper()
		for url, want := range map[string]string{
			r.LedgerMetricsURL: `paymesh_transfers_applied_total{consumer="ledger",region="eu",stream="LEDGER_EU"}`,
			r.RouterMetricsURL: submitted,
			r.APIMetricsURL:    `paymesh_idempotency_keys_total{layer="idempotency_key",outcome="replay",region="eu",topic="transfer"}`,
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
