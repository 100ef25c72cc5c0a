package faultproxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy/faultproxytest"
)

func controlServer(t *testing.T, p *faultproxy.Proxy) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(faultproxy.Handler(p))
	t.Cleanup(srv.Close)
	return srv
}

func TestControlAPI(t *testing.T) {
	ctx := context.Background()
	p := newProxy(t, faultproxytest.Echo(t))
	cl := faultproxy.NewClient(controlServer(t, p).URL)

	c := dial(t, p.Addr())
	if got, err := roundTrip(c, "relay"); err != nil || got != "relay" {
		t.Fatalf("relay: got %q, %v", got, err)
	}
	if err := cl.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, c)
	if st, err := cl.Status(ctx); err != nil || !st.Cut {
		t.Fatalf("status after cut: got %+v, %v", st, err)
	}
	if err := cl.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	after := dial(t, p.Addr())
	if got, err := roundTrip(after, "healed"); err != nil || got != "healed" {
		t.Fatalf("after heal: got %q, %v", got, err)
	}

	shape := faultproxy.Shape{Latency: 40 * time.Millisecond, Jitter: 5 * time.Millisecond, ResetRate: 0.5}
	if err := cl.SetShape(ctx, shape); err != nil {
		t.Fatal(err)
	}
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Shape != shape || st.Cut || st.Listen != p.Addr() || st.Accepted != 2 {
		t.Fatalf("status: got %+v, want shape %v, not cut, 2 accepted", st, shape)
	}
}

func TestControlLatencyPartial(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	srv := controlServer(t, p)
	p.SetShape(faultproxy.Shape{Latency: time.Second, Jitter: time.Millisecond, ResetRate: 1})
	code, body := post(t, srv.URL+"/latency", `{"jitter":"7ms"}`)
	if code != http.StatusOK {
		t.Fatalf("got %d %s", code, body)
	}
	want := faultproxy.Shape{Latency: time.Second, Jitter: 7 * time.Millisecond, ResetRate: 1}
	if got := p.Shape(); got != want {
		t.Fatalf("shape: got %v, want %v (omitted fields unchanged)", got, want)
	}
	// The answer is the status, with durations as strings.
	var raw map[string]any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"latency": "1s", "jitter": "7ms", "reset_rate": 1.0, "cut": false, "conns": 0.0, "resets": 0.0, "accepted": 0.0, "listen": p.Addr(), "target": p.Target()} {
		if raw[k] != v {
			t.Errorf("status %q: got %v, want %v", k, raw[k], v)
		}
	}
}

func TestControlRejects(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	srv := controlServer(t, p)
	before := faultproxy.Shape{Latency: 10 * time.Millisecond}
	p.SetShape(before)
	tests := map[string]struct {
		method, path, body string
		code               int
		want               string
	}{
		"UnknownPath":      {"GET", "/nope", "", 404, "no such path"},
		"WrongMethod":      {"GET", "/cut", "", 405, "want POST"},
		"WrongMethodRoot":  {"POST", "/", "", 405, "want GET"},
		"BadJSON":          {"POST", "/latency", `{"latency":`, 400, "bad JSON"},
		"EmptyBody":        {"POST", "/latency", ``, 400, "empty body"},
		"UnknownField":     {"POST", "/latency", `{"latency":"1ms","colour":"blue"}`, 400, "colour"},
		"TwoValues":        {"POST", "/latency", `{} {}`, 400, "more than one"},
		"NegativeLatency":  {"POST", "/latency", `{"latency":"-5ms"}`, 400, "latency -5ms is negative"},
		"NegativeJitter":   {"POST", "/latency", `{"jitter":"-1s"}`, 400, "jitter -1s is negative"},
		"NegativeRate":     {"POST", "/latency", `{"reset_rate":-1}`, 400, "reset_rate -1"},
		"RateTooHigh":      {"POST", "/latency", `{"reset_rate":1e6}`, 400, "above 1000"},
		"BadDuration":      {"POST", "/latency", `{"latency":"forty"}`, 400, `latency "forty": want a duration`},
		"DurationAsNumber": {"POST", "/latency", `{"latency":40}`, 400, "bad JSON"},
		// A valid field next to a bad one is not applied either.
		"HalfBad": {"POST", "/latency", `{"latency":"1s","reset_rate":-2}`, 400, "reset_rate -2"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct{ Error string }
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			if resp.StatusCode != tt.code || !strings.Contains(e.Error, tt.want) {
				t.Fatalf("got %d %q, want %d and an error containing %q", resp.StatusCode, e.Error, tt.code, tt.want)
			}
			if got := p.Status(); got.Shape != before || got.Cut {
				t.Fatalf("a rejected request changed the link: %+v", got)
			}
		})
	}
}

func TestClientReportsAPIError(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	cl := faultproxy.NewClient(controlServer(t, p).URL)
	err := cl.SetShape(context.Background(), faultproxy.Shape{Latency: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("got %v, want the API's 400 and its message", err)
	}
	if _, err := faultproxy.NewClient("http://127.0.0.1:1").Status(context.Background()); err == nil {
		t.Fatal("status from a closed port: no error")
	}
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
