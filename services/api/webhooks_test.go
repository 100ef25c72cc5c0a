package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/pkg/webhook"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/webhooks"
)

// hookReceiver keeps the events it verifies with any of its secrets.
type hookReceiver struct {
	mu      sync.Mutex
	secrets []string
	got     map[string]int // event ID → deliveries
	refused int
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	defer h.mu.Unlock()
	id, err := webhook.Verify(r.Header, body, h.secrets...)
	var ev api.EventBody
	if err == nil {
		err = json.Unmarshal(body, &ev)
	}
	if err != nil || ev.ID != id {
		h.refused++
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	h.got[id]++
}

func (h *hookReceiver) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.got[id]
}

func (h *hookReceiver) ids() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for k, v := range h.got {
		out[k] = v
	}
	return out
}

// TestWebhookEndpoints: an endpoint created in one region, retried under
// its key in another, receives the client's events of every region, each
// signed, once; it is listed and read without its secret; its attempts are
// recorded; an event is redelivered on request; a rotated secret signs;
// a deleted endpoint is gone. Every bad request is refused with a 4xx.
func TestWebhookEndpoints(t *testing.T) {
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.API = func(_ string, a *apid.Config) {
			a.WebhookAllowHosts = []string{"127.0.0.1"}
			a.WebhookSchedule = webhooks.Schedule{First: 50 * time.Millisecond, Longest: time.Second, MaxAge: time.Hour}
		}
	})
	rc := &hookReceiver{got: map[string]int{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	body := `{"url":"` + srv.URL + `/in"}`
	r := e.do(t, "eu", "POST", "/v1/webhook_endpoints", keyA, "wh-1", body)
	var ep api.WebhookEndpointBody
	r.json(t, &ep)
	if r.status != http.StatusCreated || ep.Secret == "" || ep.Status != "enabled" {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	rc.mu.Lock()
	rc.secrets = []string{ep.Secret}
	rc.mu.Unlock()
	again := e.do(t, "ap", "POST", "/v1/webhook_endpoints", keyA, "wh-1", body)
	var ep2 api.WebhookEndpointBody
	again.json(t, &ep2)
	if again.status != http.StatusCreated || ep2.ID != ep.ID || again.header.Get(api.HeaderReplayed) != "true" {
		t.Errorf("the create retried in another region: %d %s, want the first endpoint, replayed", again.status, again.body)
	}
	for _, c := range []struct{ key, body, want string }{
		{"wh-1", `{"url":"` + srv.URL + `/other"}`, "idempotency_key_reused"},
		{"", `{"url":"https://10.0.0.7/in"}`, "invalid_request"},
		{"", `{"url":"https://169.254.169.254/latest"}`, "invalid_request"},
		{"", `{"url":"http://example.com/in"}`, "invalid_request"},
		{"", `{"url":"` + srv.URL + `","types":["transfer.nope"]}`, "invalid_request"},
		{"", `{"url":"` + srv.URL + `","secret":"mine"}`, "invalid_request"},
	} {
		r := e.do(t, "us", "POST", "/v1/webhook_endpoints", keyA, c.key, c.body)
		if r.status/100 != 4 || string(r.code(t)) != c.want {
			t.Errorf("POST %s: %d %s, want %s", c.body, r.status, r.body, c.want)
		}
	}
	// Every region holds the endpoint before events are made, so none is
	// missed for the test's count.
	for _, region := range []string{"eu", "us", "ap"} {
		waitTrue(t, "the endpoint's copy in "+region, func() bool {
			var n int
			_ = e.c.Region(region).Ledger.Store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM webhook_endpoints WHERE id = $1`, ep.ID).Scan(&n)
			return n == 1
		})
	}
	src := map[string]string{}
	for _, region := range []string{"eu", "us", "ap"} {
		src[region] = e.account(t, region, keyA, 1000)
	}
	dst := e.account(t, "us", keyA, 0)
	for i, region := range []string{"eu", "us", "ap"} {
		e.sendTransfer(t, region, "wh-t-"+itoaInt(i), src[region], dst, 10)
	}
	e.quiet(t)
	recorded := map[string]bool{}
	for _, region := range []string{"eu", "us", "ap"} {
		rows, err := e.c.Region(region).Ledger.Store.Pool().Query(t.Context(), `SELECT account_id || '.' || sequence FROM events WHERE client_id = 'a'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			_ = rows.Scan(&id)
			recorded[id] = true
		}
		rows.Close()
	}
	waitTrue(t, "every event delivered", func() bool { return len(rc.ids()) == len(recorded) })
	for id, n := range rc.ids() {
		if !recorded[id] || n != 1 {
			t.Errorf("event %s delivered %d times (recorded: %v)", id, n, recorded[id])
		}
	}
	// /metrics: every region's delivered attempts add up to the events,
	// each with its latency; nothing failed.
	var delivered, latencies, failed int64
	for _, region := range []string{"eu", "us", "ap"} {
		u := e.c.Region(region).APIMetricsURL
		delivered += scrape.Sum(t, u, "paymesh_webhook_attempts_total", map[string]string{"endpoint": ep.ID, "outcome": "delivered"})
		failed += scrape.Sum(t, u, "paymesh_webhook_attempts_total", map[string]string{"endpoint": ep.ID, "outcome": "failed"})
		latencies += scrape.Sum(t, u, "paymesh_webhook_delivery_latency_seconds_count", map[string]string{"endpoint": ep.ID, "region": region})
	}
	if delivered != int64(len(recorded)) || latencies != delivered || failed != 0 {
		t.Errorf("metrics: %d delivered, %d latencies, %d failed; want %d, %d, 0", delivered, latencies, failed, len(recorded), len(recorded))
	}
	list := e.do(t, "us", "GET", "/v1/webhook_endpoints", keyA, "", "")
	var l api.WebhookEndpointList
	list.json(t, &l)
	if list.status != http.StatusOK || len(l.Endpoints) != 1 || l.Endpoints[0].ID != ep.ID || l.Endpoints[0].Secret != "" {
		t.Errorf("list: %d %s, want the one endpoint, without its secret", list.status, list.body)
	}
	if r := e.do(t, "ap", "GET", "/v1/webhook_endpoints/"+ep.ID, keyB, "", ""); r.status != http.StatusNotFound {
		t.Errorf("another client's GET: %d %s, want 404", r.status, r.body)
	}
	var someEvent string
	for id := range recorded {
		someEvent = id
		break
	}
	att := e.do(t, "eu", "GET", "/v1/webhook_endpoints/"+ep.ID+"/attempts?event="+someEvent, keyA, "", "")
	var al api.AttemptList
	att.json(t, &al)
	if att.status != http.StatusOK || len(al.Attempts) != 1 || al.Attempts[0].StatusCode != 200 || al.Attempts[0].Event != someEvent {
		t.Errorf("attempts of %s: %d %s, want one, answered 200", someEvent, att.status, att.body)
	}
	red := e.do(t, "ap", "POST", "/v1/events/"+someEvent+"/redeliver", keyA, "", `{}`)
	if red.status != http.StatusAccepted || !strings.Contains(string(red.body), ep.ID) {
		t.Fatalf("redeliver: %d %s", red.status, red.body)
	}
	waitTrue(t, "the redelivery", func() bool { return rc.count(someEvent) == 2 })
	if r := e.do(t, "ap", "POST", "/v1/events/"+someEvent+"/redeliver", keyB, "", `{}`); r.status != http.StatusNotFound {
		t.Errorf("another client's redeliver: %d %s, want 404", r.status, r.body)
	}
	for _, bad := range []string{"/v1/events/nope/redeliver", "/v1/events/" + someEvent + ".x/redeliver"} {
		if r := e.do(t, "eu", "POST", bad, keyA, "", `{}`); r.status/100 != 4 {
			t.Errorf("POST %s: %d %s, want a 4xx", bad, r.status, r.body)
		}
	}
	rot := e.do(t, "us", "POST", "/v1/webhook_endpoints/"+ep.ID+"/rotate_secret", keyA, "", "")
	var rotated api.WebhookEndpointBody
	rot.json(t, &rotated)
	if rot.status != http.StatusOK || rotated.Secret == "" || rotated.Secret == ep.Secret {
		t.Fatalf("rotate: %d %s", rot.status, rot.body)
	}
	rc.mu.Lock()
	rc.secrets = []string{rotated.Secret} // the receiver switched: the new secret alone
	rc.mu.Unlock()
	waitTrue(t, "the rotation's copies", func() bool {
		var s string
		_ = e.c.Region("ap").Ledger.Store.Pool().QueryRow(t.Context(), `SELECT secret FROM webhook_endpoints WHERE id = $1`, ep.ID).Scan(&s)
		return s == rotated.Secret
	})
	e.do(t, "ap", "POST", "/v1/events/"+someEvent+"/redeliver", keyA, "", `{}`)
	waitTrue(t, "a delivery signed with the new secret", func() bool { return rc.count(someEvent) == 3 })
	if r := e.do(t, "eu", "DELETE", "/v1/webhook_endpoints/"+ep.ID, keyA, "", ""); r.status != http.StatusOK {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := e.do(t, "us", "GET", "/v1/webhook_endpoints/"+ep.ID, keyA, "", ""); r.status != http.StatusNotFound {
		t.Errorf("GET after delete: %d %s, want 404", r.status, r.body)
	}
	if rc.refused != 0 {
		t.Errorf("%d deliveries did not verify", rc.refused)
	}
}

// waitTrue waits for ok, failing past a generous bound.
func waitTrue(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !ok(); time.Sleep(25 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestFailingEndpointDisabled: an endpoint whose deliveries fail past the
// schedule's age is disabled by every region that gave up on it, and its
// home records one webhook_endpoint.disabled event, with the reason: in
// the client's feed, and delivered to the client's other endpoint, which
// takes that type alone.
func TestFailingEndpointDisabled(t *testing.T) {
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.API = func(_ string, a *apid.Config) {
			a.WebhookAllowHosts = []string{"127.0.0.1"}
			a.WebhookSchedule = webhooks.Schedule{First: 20 * time.Millisecond, Longest: 100 * time.Millisecond, MaxAge: 500 * time.Millisecond}
		}
	})
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	t.Cleanup(down.Close)
	rc := &hookReceiver{got: map[string]int{}}
	up := httptest.NewServer(rc)
	t.Cleanup(up.Close)
	var failing, watcher api.WebhookEndpointBody
	e.do(t, "eu", "POST", "/v1/webhook_endpoints", keyA, "wh-down", `{"url":"`+down.URL+`/in"}`).json(t, &failing)
	e.do(t, "us", "POST", "/v1/webhook_endpoints", keyA, "wh-up", `{"url":"`+up.URL+`/in","types":["webhook_endpoint.disabled"]}`).json(t, &watcher)
	if failing.ID == "" || watcher.Secret == "" {
		t.Fatalf("endpoints: %+v %+v", failing, watcher)
	}
	rc.mu.Lock()
	rc.secrets = []string{watcher.Secret}
	rc.mu.Unlock()
	for _, region := range []string{"eu", "us", "ap"} {
		waitTrue(t, "both endpoints' copies in "+region, func() bool {
			var n int
			_ = e.c.Region(region).Ledger.Store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM webhook_endpoints WHERE id IN ($1, $2)`,
				failing.ID, watcher.ID).Scan(&n)
			return n == 2
		})
	}
	// Events in eu, its home, and in us: both regions' workers give up.
	for _, region := range []string{"eu", "us"} {
		from, to := e.account(t, region, keyA, 100), e.account(t, region, keyA, 0)
		e.sendTransfer(t, region, "wh-down-"+region, from, to, 10)
	}
	for _, region := range []string{"eu", "us"} {
		waitTrue(t, "the endpoint disabled by "+region+"'s worker", func() bool {
			var st string
			_ = e.c.Region(region).Ledger.Store.Pool().QueryRow(t.Context(), `SELECT status FROM webhook_endpoints WHERE id = $1`, failing.ID).Scan(&st)
			return st == "disabled"
		})
	}
	var feed api.EventList
	waitTrue(t, "the disabled event in the feed", func() bool {
		feed = api.EventList{}
		e.do(t, "ap", "GET", "/v1/events?type=webhook_endpoint.disabled", keyA, "", "").json(t, &feed)
		return len(feed.Events) > 0
	})
	ev := feed.Events[0]
	w := ev.Data.WebhookEndpoint
	if len(feed.Events) != 1 || ev.ID != failing.ID+".1" || ev.Account != failing.ID || ev.Type != "webhook_endpoint.disabled" || w == nil ||
		w.ID != failing.ID || w.Status != "disabled" || !strings.Contains(w.DisabledReason, "answered 503") ||
		ev.Data.Transfer != nil || ev.Data.Account != nil {
		t.Fatalf("the feed's disabled events: %+v (endpoint %+v)", feed.Events, w)
	}
	waitTrue(t, "the disabled event delivered to the other endpoint", func() bool { return rc.count(ev.ID) == 1 })
	var got api.WebhookEndpointBody
	e.do(t, "us", "GET", "/v1/webhook_endpoints/"+failing.ID, keyA, "", "").json(t, &got)
	if got.Status != "disabled" {
		t.Errorf("the failing endpoint: %+v, want disabled", got)
	}
	// A later change of the disabled endpoint is no second disabling.
	if r := e.do(t, "ap", "POST", "/v1/webhook_endpoints/"+failing.ID+"/rotate_secret", keyA, "", ""); r.status != http.StatusOK {
		t.Fatalf("rotate the disabled endpoint's secret: %d %s", r.status, r.body)
	}
	e.quiet(t)
	var events int
	for _, region := range []string{"eu", "us", "ap"} {
		var n int
		if err := e.c.Region(region).Ledger.Store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM events WHERE account_id = $1`, failing.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		events += n
	}
	if ids := rc.ids(); events != 1 || len(ids) != 1 {
		t.Errorf("%d events of the endpoint in all regions, %d delivered to the other (%v); want 1 and 1", events, len(ids), ids)
	}
	if rep, err := postgres.VerifyGlobal(t.Context(), e.c.Stores(), true); err != nil || !rep.OK() {
		t.Errorf("verify: %v %+v", err, rep)
	}
}
