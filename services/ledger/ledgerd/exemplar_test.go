package ledgerd_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// TestExemplars: a measurement recorded with a sampled span in its context
// keeps the span's trace as an exemplar, which an OpenMetrics scrape shows
// on the histogram buckets; one without a sampled span keeps none, and the
// plain Prometheus text format shows none.
func TestExemplars(t *testing.T) {
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	observe, err := ledgerd.NewObserver(m, "eu", "LEDGER_EU")
	if err != nil {
		t.Fatal(err)
	}
	span := func(traceID byte, flags trace.TraceFlags) context.Context {
		return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{traceID, 1}, SpanID: trace.SpanID{traceID, 2}, TraceFlags: flags}))
	}
	sampled, unsampled := span(0xaa, trace.FlagsSampled), span(0xbb, 0)
	for _, ctx := range []context.Context{sampled, unsampled} {
		now := time.Now()
		observe.Batch(ctx, ledgerstream.Batch{Stored: now.Add(-time.Millisecond), Formed: now, Applying: now, Done: now.Add(3 * time.Millisecond),
			Tx: ledger.TxTimes{Began: now, Committing: now.Add(time.Millisecond), Committed: now.Add(2 * time.Millisecond)}})
		observe.Stage(ctx, ledger.StageCredit, 40*time.Millisecond)
	}
	scrape := func(accept string) string {
		req := httptest.NewRequest("GET", "/metrics", nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, req)
		b, _ := io.ReadAll(rec.Body)
		return string(b)
	}
	om := scrape("application/openmetrics-text; version=1.0.0")
	want := `trace_id="` + (trace.TraceID{0xaa, 1}).String() + `"`
	for _, name := range []string{"paymesh_apply_duration_seconds_bucket", "paymesh_apply_batch_size_bucket", "paymesh_apply_commit_duration_seconds_bucket", "paymesh_apply_wait_seconds_bucket", "paymesh_saga_stage_duration_seconds_bucket"} {
		var found bool
		for _, l := range strings.Split(om, "\n") {
			if strings.HasPrefix(l, name+"{") && strings.Contains(l, " # {") && strings.Contains(l, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("OpenMetrics scrape: no %s exemplar on %s", want, name)
		}
	}
	if unwanted := (trace.TraceID{0xbb, 1}).String(); strings.Contains(om, unwanted) {
		t.Errorf("OpenMetrics scrape: exemplar of the unsampled trace %s", unwanted)
	}
	if text := scrape(""); strings.Contains(text, "trace_id") || !strings.Contains(text, "paymesh_saga_stage_duration_seconds_bucket") {
		t.Errorf("text format: want the histograms without exemplars:\n%s", text)
	}
}
