package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/tracerec"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/api"
)

// TestReplayLeavesATrace: with the services' sampler at a ratio of 0, a
// request's spans are not recorded, but its replay (the same
// Idempotency-Key sent again, a duplicate known only once the key is read)
// leaves a span of its own naming the layer and the cause. (This package's
// only global tracer provider: tracers bind to the first.)
func TestReplayLeavesATrace(t *testing.T) {
	rec := tracerec.Install(telemetry.RetrySampler(0))
	e := mustEnv(t, 24*time.Hour)
	from, to := e.account(t, "eu", keyA, 100), e.account(t, "eu", keyA, 0)
	first := e.do(t, "eu", "POST", "/v1/transfers", keyA, "traced-replay", transferJSON(from, to, 5))
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	again := e.do(t, "eu", "POST", "/v1/transfers", keyA, "traced-replay", transferJSON(from, to, 5))
	if again.status != first.status || again.header.Get(api.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d %s (replayed %q)", again.status, again.body, again.header.Get(api.HeaderReplayed))
	}
	var caught []map[string]string
	for _, s := range rec.Ended() {
		attrs := tracerec.Attrs(s)
		if s.Name() == "duplicate caught" {
			caught = append(caught, attrs)
		} else if attrs["paymesh.dedup.outcome"] == "" && attrs[telemetry.AttrAttempt] == "" {
			t.Errorf("span %q recorded at ratio 0: %v", s.Name(), attrs)
		}
	}
	if len(caught) != 1 || caught[0]["paymesh.dedup.layer"] != "idempotency_key" || caught[0]["paymesh.dedup.cause"] != "client_retry" {
		t.Fatalf("duplicate caught spans: %v, want one of layer idempotency_key, cause client_retry", caught)
	}
}
