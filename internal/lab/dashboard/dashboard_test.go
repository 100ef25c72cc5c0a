package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// spans returns a tracer that feeds rec.
func spans(rec *dashboard.Recorder) trace.Tracer {
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
}

// delivery records a send, and a process span per attempt of it; attempts
// after the first are duplicates caught by layer and link to the first.
func delivery(tr trace.Tracer, attempts int, layer string) trace.TraceID {
	ctx, send := tr.Start(context.Background(), "send route.eu.us.1", trace.WithAttributes(attribute.String("paymesh.region", "eu")))
	var first trace.SpanContext
	for n := 1; n <= attempts; n++ {
		var opts []trace.SpanStartOption
		attrs := []attribute.KeyValue{attribute.String("paymesh.region", "us"), attribute.Int("messaging.nats.delivery_count", n)}
		if n == 1 {
			attrs = append(attrs, attribute.String("paymesh.dedup.outcome", "first"))
		} else {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: first, Attributes: []attribute.KeyValue{attribute.String("paymesh.link", "first_attempt")}}))
			attrs = append(attrs, attribute.String("paymesh.dedup.outcome", "duplicate"), attribute.String("paymesh.dedup.layer", layer))
		}
		_, p := tr.Start(ctx, "process ledger.us.1", append(opts, trace.WithAttributes(attrs...))...)
		if n == 1 {
			first = p.SpanContext()
		}
		p.End()
	}
	send.End()
	return send.SpanContext().TraceID()
}

func TestRecorderKeepsTracesWithARetryOrDuplicate(t *testing.T) {
	rec := dashboard.NewRecorder()
	tr := spans(rec)
	plain := delivery(tr, 1, "")
	retried := delivery(tr, 2, "recent_cache")

	list := rec.Traces()
	if len(list) != 1 || list[0].TraceID != retried.String() {
		t.Fatalf("kept traces: %+v, want only %s", list, retried)
	}
	got := list[0]
	if strings.Join(got.Reasons, ",") != "redelivery,duplicate" || strings.Join(got.Layers, ",") != "recent_cache" ||
		strings.Join(got.Regions, ",") != "us,eu" || got.Spans != 3 || got.Root != "send route.eu.us.1" {
		t.Fatalf("summary: %+v", got)
	}
	full, ok := rec.Trace(retried)
	if !ok || len(full.SpanList) != 3 {
		t.Fatalf("trace %s: %v %+v", retried, ok, full)
	}
	redelivery := full.SpanList[2]
	if redelivery.ParentID != full.SpanList[0].SpanID || len(redelivery.Links) != 1 ||
		redelivery.Links[0].SpanID != full.SpanList[1].SpanID || redelivery.Links[0].Kind != "first_attempt" {
		t.Fatalf("redelivery span: %+v (spans %+v)", redelivery, full.SpanList)
	}
	// A recent trace without a retry is not listed, but still opens.
	if _, ok := rec.Trace(plain); !ok {
		t.Fatal("a recent trace is not kept")
	}
}

func TestRecorderIsBounded(t *testing.T) {
	rec := dashboard.NewRecorder()
	tr := spans(rec)
	first := delivery(tr, 2, "dedup_table")
	for range 5000 {
		delivery(tr, 1, "")
	}
	if _, ok := rec.Trace(first); !ok {
		t.Fatal("a trace with a retry was dropped with the recent ones")
	}
	plainFirst := delivery(tr, 1, "")
	for range 5000 {
		delivery(tr, 1, "")
	}
	if _, ok := rec.Trace(plainFirst); ok {
		t.Fatal("the recorder keeps every trace")
	}
	for range 300 {
		delivery(tr, 2, "dedup_table")
	}
	if n := len(rec.Traces()); n != 200 {
		t.Fatalf("kept traces: %d, want the last 200", n)
	}
	if _, ok := rec.Trace(first); ok {
		t.Fatal("the oldest kept trace was not dropped")
	}
}

// TestTraceListsAreArrays: a trace whose publish was retried and whose
// repeat no layer caught has no layers; /api/traces lists them as [], not
// null, which the page cannot map over (a loaded run's retried forwards left
// the whole list undrawn).
func TestTraceListsAreArrays(t *testing.T) {
	rec := dashboard.NewRecorder()
	_, send := spans(rec).Start(context.Background(), "forward ledger.us.1")
	send.AddEvent("retry", trace.WithAttributes(attribute.Int64("paymesh.attempt", 2)))
	send.End()
	srv := httptest.NewServer(dashboard.New(dashboard.Config{Source: &source{}, Recorder: rec}).Handler())
	defer srv.Close()
	var list []map[string]any
	getJSON(t, srv.URL+"/api/traces", &list)
	if len(list) != 1 {
		t.Fatalf("traces: %v, want the retried one", list)
	}
	for _, field := range []string{"regions", "reasons", "layers"} {
		if _, ok := list[0][field].([]any); !ok {
			t.Errorf("%s: %#v, want an array", field, list[0][field])
		}
	}
}

// source is a fixed set of counters.
type source struct{ applied int64 }

func (s *source) Regions() []string { return []string{"eu"} }
func (s *source) Sample(context.Context) (map[string]dashboard.RegionSample, error) {
	s.applied += 100
	return map[string]dashboard.RegionSample{"eu": {Applied: s.applied, Duplicates: map[string]int64{"msg_id": s.applied / 10}}}, nil
}
func (s *source) Verify(context.Context) (postgres.Report, error) {
	return postgres.Report{Checks: []postgres.Check{{Name: "balance", OK: true, Checked: 3}}}, nil
}

func TestHandler(t *testing.T) {
	rec := dashboard.NewRecorder()
	id := delivery(spans(rec), 3, "dedup_table")
	d := dashboard.New(dashboard.Config{Source: &source{}, Recorder: rec})
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()

	get := func(path string, want int, into any) string {
		t.Helper()
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var body json.RawMessage
		_ = json.NewDecoder(res.Body).Decode(&body)
		if res.StatusCode != want {
			t.Fatalf("GET %s: %d %s, want %d", path, res.StatusCode, body, want)
		}
		if into != nil {
			if err := json.Unmarshal(body, into); err != nil {
				t.Fatal(err)
			}
		}
		return string(body)
	}
	var list []dashboard.TraceSummary
	get("/api/traces", 200, &list)
	if len(list) != 1 || list[0].TraceID != id.String() {
		t.Fatalf("traces: %+v", list)
	}
	var tr dashboard.Trace
	get("/api/traces/"+id.String(), 200, &tr)
	if len(tr.SpanList) != 4 {
		t.Fatalf("trace: %+v", tr)
	}
	for _, bad := range []string{"xyz", strings.Repeat("0", 32), id.String() + "00", strings.ToUpper(id.String())} {
		if body := get("/api/traces/"+bad, 400, nil); !strings.Contains(body, "32 lowercase hex digits") {
			t.Errorf("GET /api/traces/%s: %s", bad, body)
		}
	}
	get("/api/traces/"+fmt.Sprintf("%032x", 42), 404, nil)

	res, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
}

// TestSamplesAreRates: the page gets rates per second between samples, and
// the latest invariant check.
func TestSamplesAreRates(t *testing.T) {
	d := dashboard.New(dashboard.Config{Source: &source{}, Interval: 20 * time.Millisecond, Verify: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	d.Run(ctx)
	st := d.Stats()
	if len(st.Points) < 3 || st.Invariants == nil || !st.Invariants.OK || len(st.Invariants.Checks) != 1 {
		t.Fatalf("stats: %+v", st)
	}
	for _, p := range st.Points {
		if p.Regions["eu"].Applied <= 0 || p.Layers["msg_id"] <= 0 {
			t.Fatalf("point %+v: want positive rates", p)
		}
	}
	if strings.Join(st.Layers, ",") != "msg_id" || st.Totals["eu"].Applied < 300 {
		t.Fatalf("stats: layers %v totals %+v", st.Layers, st.Totals)
	}
}

// TestWebhookRates: with a receiver's counts, each point has its delivery
// and duplicate rates and the totals are served; without, none.
func TestWebhookRates(t *testing.T) {
	var n atomic.Int64
	d := dashboard.New(dashboard.Config{Source: &source{}, Interval: 20 * time.Millisecond, Verify: time.Hour,
		Webhooks: func() dashboard.WebhookSample {
			v := n.Add(10)
			return dashboard.WebhookSample{Received: v, Duplicates: v / 10}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	d.Run(ctx)
	st := d.Stats()
	if len(st.Points) < 3 || st.Webhooks == nil || st.Webhooks.Received < 30 || st.Webhooks.Duplicates != st.Webhooks.Received/10 {
		t.Fatalf("stats: points %d, webhooks %+v", len(st.Points), st.Webhooks)
	}
	for _, p := range st.Points {
		if p.Webhooks == nil || p.Webhooks.Received <= 0 || p.Webhooks.Duplicates <= 0 {
			t.Fatalf("point %+v: want the receiver's rates", p)
		}
	}
	plain := dashboard.New(dashboard.Config{Source: &source{}, Interval: 20 * time.Millisecond, Verify: time.Hour})
	pctx, pcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer pcancel()
	plain.Run(pctx)
	if st := plain.Stats(); st.Webhooks != nil || len(st.Points) == 0 || st.Points[0].Webhooks != nil {
		t.Fatalf("without a receiver: %+v", st)
	}
}

// TestAPIGroupTraces: the API's group transaction is a span of its own,
// linked to each request in it. The group is not a retry (it is left out),
// and a request the group found to be a duplicate is kept, naming its
// region and the layer, as a ledger delivery is.
func TestAPIGroupTraces(t *testing.T) {
	rec := dashboard.NewRecorder()
	tr := spans(rec)
	_, first := tr.Start(context.Background(), "paymesh api", trace.WithAttributes(attribute.String("paymesh.region", "eu"),
		attribute.String("paymesh.dedup.outcome", "first")))
	_, again := tr.Start(context.Background(), "paymesh api", trace.WithAttributes(attribute.String("paymesh.region", "eu"),
		attribute.String("paymesh.dedup.outcome", "duplicate"), attribute.String("paymesh.dedup.layer", "business_key")))
	member := []attribute.KeyValue{attribute.String("paymesh.link", "batch_member")}
	_, group := tr.Start(context.Background(), "apply batch here", trace.WithLinks(
		trace.Link{SpanContext: first.SpanContext(), Attributes: member}, trace.Link{SpanContext: again.SpanContext(), Attributes: member}))
	group.End()
	first.End()
	again.End()

	list := rec.Traces()
	if len(list) != 1 || list[0].TraceID != again.SpanContext().TraceID().String() {
		t.Fatalf("kept traces: %+v, want only the duplicate request's", list)
	}
	if got := list[0]; strings.Join(got.Regions, ",") != "eu" || strings.Join(got.Layers, ",") != "business_key" ||
		strings.Join(got.Reasons, ",") != "duplicate" {
		t.Fatalf("summary: %+v, want region eu, layer business_key, reason duplicate", got)
	}
	if _, ok := rec.Trace(group.SpanContext().TraceID()); ok {
		t.Fatal("the group's own span is recorded: it would list every group as a retry")
	}
}

// TestStatsListsBeforeAnySample: /api/stats before the first sample has
// [] for its lists, which the page maps over, not null.
func TestStatsListsBeforeAnySample(t *testing.T) {
	srv := httptest.NewServer(dashboard.New(dashboard.Config{Source: &source{}}).Handler())
	defer srv.Close()
	var st map[string]any
	getJSON(t, srv.URL+"/api/stats", &st)
	for _, field := range []string{"regions", "layers", "points"} {
		if _, ok := st[field].([]any); !ok {
			t.Errorf("%s: %#v, want an array", field, st[field])
		}
	}
}

// getJSON decodes the JSON answer to GET url into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
