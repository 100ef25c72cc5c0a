package promcheck_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/router"
	"github.com/paymesh/paymesh/services/router/routerd"
)

// TestDashboardQueriesExist: every metric a query of the Grafana dashboard
// names is one the services really export.
func TestDashboardQueriesExist(t *testing.T) {
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := ledgerd.ObserveLedger(m, "eu", "LEDGER_EU", &ledger.Stats{}); err != nil {
		t.Fatal(err)
	}
	if err := routerd.ObserveRouter(m, "eu", &router.Stats{}); err != nil {
		t.Fatal(err)
	}
	store := ledgertest.New(t).Store
	if err := ledgerd.ObserveStore(m, "eu", store); err != nil {
		t.Fatal(err)
	}
	if err := ledgerd.ObserveDatabase(m, "eu", store, 0); err != nil {
		t.Fatal(err)
	}
	if err := apid.ObserveAPI(m, "eu", &api.Stats{}); err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveBacklog("eu", "LEDGER_EU", func(context.Context) (int64, error) { return 0, nil }); err != nil {
		t.Fatal(err)
	}
	// The dead-letter census exports its gauges once it knows a dead letter.
	if err := ledgerd.ObserveDeadLetters(m, "eu", census(t)); err != nil {
		t.Fatal(err)
	}
	observe, err := ledgerd.NewObserver(m, "eu", "LEDGER_EU")
	if err != nil {
		t.Fatal(err)
	}
	// Histograms appear once they hold a value.
	now := time.Now()
	observe.Batch(context.Background(), ledgerstream.Batch{Stored: now.Add(-time.Millisecond), Formed: now, Applying: now, Done: now.Add(time.Millisecond),
		Tx: ledger.TxTimes{Began: now, Committing: now, Committed: now.Add(time.Millisecond)}})
	observe.Stage(context.Background(), ledger.StageSettle, time.Second)
	ages, err := telemetry.NewDuplicateAges(m, "eu", "ledger")
	if err != nil {
		t.Fatal(err)
	}
	ages.Record(context.Background(), "transfer", string(ledger.LayerConsumeLog), string(ledger.CauseRedelivery), time.Second)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	exported := map[string]bool{}
	for _, l := range strings.Split(string(body), "\n") {
		if name, _, ok := strings.Cut(l, "{"); ok && !strings.HasPrefix(l, "#") {
			exported[name] = true
		}
	}
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`paymesh_[a-z_]+`)
	var queries int
	queried := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			for _, n := range name.FindAllString(tg.Expr, -1) {
				queried[n] = true
				if !exported[n] {
					t.Errorf("panel %q queries %s, which no service exports", p.Title, n)
				}
			}
		}
	}
	if queries == 0 || len(exported) == 0 {
		t.Fatalf("%d queries checked against %d exported metrics", queries, len(exported))
	}
	for _, n := range []string{"paymesh_dlq_depth", "paymesh_dlq_oldest_seconds"} {
		if !queried[n] {
			t.Errorf("no panel queries %s", n)
		}
	}
}

// census returns region eu's dead-letter census, refreshed on an embedded
// JetStream whose DLQ_EU holds one dead letter.
func census(t *testing.T) *dlq.Census {
	t.Helper()
	ctx := context.Background()
	_, nc := natsembed.MustStart(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	topo := ledgerstream.Topology{Region: "eu", Shards: 1}
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(topo.DLQSubject())
	m.Data = []byte("not a command")
	m.Header.Set(ledgerstream.HeaderDLQReason, string(ledger.CodeInvalidRequest))
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	c := dlq.NewCensus(js, "eu")
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDashboardRegionVariable: the dashboard has a region variable (all
// values of paymesh_deliveries_total's region label, several at once or
// all), and every metric every panel queries is filtered by it.
func TestDashboardRegionVariable(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
				Query      struct {
					Query string `json:"query"`
				} `json:"query"`
				Multi      bool `json:"multi"`
				IncludeAll bool `json:"includeAll"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range dash.Templating.List {
		if v.Name != "region" {
			continue
		}
		found = true
		if v.Query.Query != "label_values(paymesh_deliveries_total, region)" || !v.Multi || !v.IncludeAll {
			t.Errorf("variable region: query %q multi %v include all %v, want label_values(paymesh_deliveries_total, region), multi, include all",
				v.Query.Query, v.Multi, v.IncludeAll)
		}
	}
	if !found {
		t.Fatal("no region variable in the dashboard's templating")
	}
	// A metric selector: a name, then its matchers if any.
	selector := regexp.MustCompile(`(paymesh_[a-z_]+|ALERTS)(\{[^}]*\})?`)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(m[2], `region=~"$region"`) {
					t.Errorf("panel %q: %s is not filtered by region=~\"$region\"", p.Title, m[0])
				}
			}
		}
	}
}
