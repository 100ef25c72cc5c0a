package webhooks_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/webhooks"
)

// TestGuardRefusesWhatIsNotPublic: each kind of address that is not the
// internet's is refused at creation, unless the operator named its host.
func TestGuardRefusesWhatIsNotPublic(t *testing.T) {
	g := webhooks.NewGuard([]string{"receiver.internal", "127.0.0.2"})
	for _, raw := range []string{"https://127.0.0.1/", "https://localhost:8443/", "https://10.1.2.3/", "https://192.168.0.9/",
		"https://169.254.169.254/latest/meta-data", "https://[::1]/", "https://[fd00::1]/", "https://0.0.0.0/", "https://100.64.0.1/"} {
		u, _ := url.Parse(raw)
		if err := g.Check(context.Background(), u); err == nil || !strings.Contains(err.Error(), "not a public address") {
			t.Errorf("%s: %v, want refused as not public", raw, err)
		}
	}
	for _, raw := range []string{"https://93.184.215.14/", "https://receiver.internal/", "https://127.0.0.2:9000/"} {
		u, _ := url.Parse(raw)
		if err := g.Check(context.Background(), u); err != nil {
			t.Errorf("%s: %v, want allowed", raw, err)
		}
	}
	u, _ := url.Parse("https://no-such-host.invalid/")
	if err := g.Check(context.Background(), u); err == nil || !strings.Contains(err.Error(), "does not resolve") {
		t.Errorf("unresolvable host: %v", err)
	}
}

// TestCheckURL refuses each URL paymesh does not deliver to.
func TestCheckURL(t *testing.T) {
	allowed := webhooks.NewGuard([]string{"localhost"}).Allowed
	for raw, want := range map[string]string{
		"ftp://example.com/":           "not an absolute http(s) URL",
		"/relative":                    "not an absolute http(s) URL",
		"https://user:pw@example.com/": "credentials",
		"https://example.com/#x":       "fragment",
		"http://example.com/":          "plain http",
		"https://example.com/" + strings.Repeat("a", webhooks.MaxURLLength): "longer than",
		"https://exa mple.com/": "does not parse",
	} {
		if _, err := webhooks.CheckURL(raw, allowed); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.60s: %v, want %q", raw, err, want)
		}
	}
	for _, raw := range []string{"https://example.com/hooks?x=1", "http://localhost:8080/in"} {
		if _, err := webhooks.CheckURL(raw, allowed); err != nil {
			t.Errorf("%s: %v", raw, err)
		}
	}
}

// TestScheduleDoublesToLongestAndEnds: the waits double up to Longest, a
// last try lands at MaxAge, and after it the delivery ends.
func TestScheduleDoublesToLongestAndEnds(t *testing.T) {
	s := webhooks.DefaultSchedule
	q := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for n, want := range map[int]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 12: 6 * time.Hour, 40: 6 * time.Hour} {
		if at, ok := s.Next(q, q, n, 0); !ok || at.Sub(q) != want {
			t.Errorf("after attempt %d: %v %v, want %v", n, at.Sub(q), ok, want)
		}
	}
	late := q.Add(71 * time.Hour)
	if at, ok := s.Next(q, late, 20, 0); !ok || !at.Equal(q.Add(72*time.Hour)) {
		t.Errorf("near the end: %v %v, want a last try at 72 h", at, ok)
	}
	if _, ok := s.Next(q, q.Add(72*time.Hour), 21, 0); ok {
		t.Error("at 72 h: want no more tries")
	}
	if err := (webhooks.Schedule{First: time.Second}).Check(); err == nil {
		t.Error("a schedule with no longest and no max age passed its check")
	}
}
