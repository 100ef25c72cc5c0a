package idemcheck_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/internal/testbed/racyapi"
	"github.com/paymesh/paymesh/pkg/idemcheck"
)

// TestRacyAPIFails: against an API that stores its answer only after the
// effect, the cases that send a second request while the first is being
// processed FAIL, each with the effects it read back, and the cases a
// request at a time PASS (the kit does not fail everything).
func TestRacyAPIFails(t *testing.T) {
	srv := httptest.NewServer(racyapi.New())
	t.Cleanup(srv.Close)
	cfg, err := idemcheck.LoadConfig(filepath.Join("testdata", "racyapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rs := idemcheck.Run(context.Background(), cfg, idemcheck.Options{URLs: []string{srv.URL}}, &out)
	if !idemcheck.Failed(rs) {
		t.Fatalf("no case failed against racyapi:\n%s", out.String())
	}
	t.Log("\n" + out.String())
	want := map[string]idemcheck.Verdict{
		"missing_key": idemcheck.Pass, "key_too_long": idemcheck.Pass, "replay": idemcheck.Pass, "other_body": idemcheck.Pass,
		"in_flight": idemcheck.Fail, "concurrent": idemcheck.Fail, "timeout_retry": idemcheck.Fail,
		"other_region": idemcheck.Skip, "other_resource": idemcheck.Skip, "expiry": idemcheck.Skip,
	}
	for _, r := range rs {
		if r.Verdict != want[r.Case] {
			t.Errorf("%s: got %s (%s), want %s", r.Case, r.Verdict, r.Detail, want[r.Case])
		}
		if r.Verdict == idemcheck.Fail && !strings.Contains(r.Detail, "effects read back, want 1") {
			t.Errorf("%s: FAIL without the effects read back: %s", r.Case, r.Detail)
		}
	}
	if !strings.Contains(out.String(), "idemcheck "+srv.URL+": 4 PASS, 3 FAIL, 3 SKIP") {
		t.Errorf("summary: got\n%s", out.String())
	}
}

// TestOtherRegionNotLetIn: a second region that does not let the
// client in (401) fails other_region: a refusal for want of credentials
// proves nothing about the key.
func TestOtherRegionNotLetIn(t *testing.T) {
	srv := httptest.NewServer(racyapi.New())
	t.Cleanup(srv.Close)
	locked := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	t.Cleanup(locked.Close)
	cfg, err := idemcheck.LoadConfig(filepath.Join("testdata", "racyapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, r := range idemcheck.Run(context.Background(), cfg, idemcheck.Options{URLs: []string{srv.URL, locked.URL}}, &out) {
		if r.Case == "other_region" && (r.Verdict != idemcheck.Fail || !strings.Contains(r.Detail, "not let in")) {
			t.Errorf("other_region: got %s (%s), want FAIL: not let in", r.Verdict, r.Detail)
		}
	}
}

// TestLoadConfigRefuses: a config that cannot be used is refused with
// ErrConfig and a message that names what is wrong.
func TestLoadConfigRefuses(t *testing.T) {
	good := "request: {method: POST, path: /things, body: '{\"u\":\"{{unique}}\"}'}\nkey: {max_length: 255}\neffects: {path: '/things?u={{unique}}'}\n"
	for _, tt := range []struct {
		name, text, want string
	}{
		{"NotYAML", "request: [", "yaml"},
		{"UnknownField", good + "retries: 3\n", "field retries not found"},
		{"NoUnique", strings.Replace(good, "{{unique}}", "x", 1), "request.body has no {{unique}}"},
		{"BadMethod", strings.Replace(good, "POST", "GET", 1), `request.method "GET"`},
		{"NoPath", strings.Replace(good, "path: /things,", "path: things,", 1), `request.path "things"`},
		{"NoEffects", strings.Replace(good, "effects: {path: '/things?u={{unique}}'}", "", 1), "effects.path"},
		{"NoMaxLength", strings.Replace(good, "key: {max_length: 255}", "key: {}", 1), "key.max_length 0"},
		{"BadDuration", good + "settle: soon\n", `"soon" is not a duration`},
		{"UnsetVariable", good + "headers: {Authorization: 'Bearer ${IDEMCHECK_TEST_UNSET_KEY}'}\n", "environment variables not set: IDEMCHECK_TEST_UNSET_KEY"},
		{"Concurrency", good + "concurrency: 1\n", "concurrency 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(path, []byte(tt.text), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := idemcheck.LoadConfig(path)
			if !errors.Is(err, idemcheck.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want ErrConfig naming %q", err, tt.want)
			}
		})
	}
	if _, err := idemcheck.LoadConfig(filepath.Join(t.TempDir(), "none.yaml")); !errors.Is(err, idemcheck.ErrConfig) {
		t.Errorf("a missing file: got %v, want ErrConfig", err)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	t.Setenv("IDEMCHECK_TEST_KEY", "k1")
	if err := os.WriteFile(path, []byte(good+"headers: {Authorization: 'Bearer ${IDEMCHECK_TEST_KEY}'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := idemcheck.LoadConfig(path); err != nil || c.Headers["Authorization"] != "Bearer k1" || c.Concurrency != 16 || c.Key.Header != "Idempotency-Key" {
		t.Errorf("a good config: got %+v, %v; want the variable's value and the defaults", c, err)
	}
}
