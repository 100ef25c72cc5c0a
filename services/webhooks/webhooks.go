// Package webhooks is the domain of webhook delivery: a client's endpoints
// (a URL, the event types it takes, its signing secret), the checks an
// endpoint's URL passes before paymesh sends anything to it (Guard), and
// when a failed delivery is tried again (Schedule).
//
// A region's events (services/ledger/postgres's events table, the events'
// outbox) are delivered from that region, to every endpoint of the
// event's client, at least once and, for one account, in sequence order:
// services/webhooks/webhookdb keeps the endpoints and the deliveries, and
// services/webhooks/delivery sends them.
package webhooks

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// Status is an endpoint's state.
type Status string

// The states of an endpoint. Only an enabled one is delivered to; a
// disabled one (its deliveries failed for MaxAge) keeps its record, and a
// deleted one is kept until every region has learnt of the deletion.
const (
	Enabled  Status = "enabled"
	Disabled Status = "disabled"
	Deleted  Status = "deleted"
)

// Endpoint is a client's webhook endpoint, as every region holds it: its
// home region (its ID's) writes it, and the others hold copies, at the
// copy's Version.
type Endpoint struct {
	ID     string
	Client string
	URL    string
	// Types are the event types it takes; none: every type.
	Types []ledger.EventType
	// Secret signs every delivery. PreviousSecret, while PreviousUntil is
	// ahead, signs it too (a rotation's overlap).
	Secret         string
	PreviousSecret string
	PreviousUntil  time.Time
	Status         Status
	// DisabledReason says why a disabled endpoint was.
	DisabledReason string
	// Version counts the endpoint's changes: a copy is replaced only by a
	// higher one.
	Version   int64
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Secrets returns the secrets that sign a delivery at now.
func (e Endpoint) Secrets(now time.Time) []string {
	if e.PreviousSecret != "" && now.Before(e.PreviousUntil) {
		return []string{e.Secret, e.PreviousSecret}
	}
	return []string{e.Secret}
}

// Takes reports whether the endpoint takes events of type t.
func (e Endpoint) Takes(t ledger.EventType) bool {
	return len(e.Types) == 0 || slices.Contains(e.Types, t)
}

// MaxEndpoints is how many endpoints a client may have (not deleted).
const MaxEndpoints = 16

// MaxURLLength bounds an endpoint's URL.
const MaxURLLength = 2048

// CheckURL refuses a URL paymesh does not deliver to: not absolute http or
// https, with user info or a fragment, too long, or plain http to a host
// the operator did not allow (allowed: Guard.Allowed). Where the host
// points is the Guard's to check.
func CheckURL(raw string, allowed func(host string) bool) (*url.URL, error) {
	if len(raw) > MaxURLLength {
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "url is longer than %d bytes", MaxURLLength)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "url %.80q does not parse: %v", raw, err)
	case u.Scheme != "https" && u.Scheme != "http", u.Host == "", u.Opaque != "":
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "url %.80q is not an absolute http(s) URL", raw)
	case u.User != nil:
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "url %.80q holds credentials: sign deliveries with the secret instead", raw)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "url %.80q has a fragment", raw)
	case u.Scheme == "http" && !allowed(u.Hostname()):
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "url %.80q is plain http: deliveries go over https", raw)
	}
	return u, nil
}

// Schedule says when a failed delivery is tried again: after First, then
// twice as long each time up to Longest, with a tenth of jitter either way,
// until MaxAge after the event was queued, when the delivery fails for good
// and its endpoint is disabled.
type Schedule struct {
	First, Longest, MaxAge time.Duration
}

// DefaultSchedule retries for 72 hours: 30 s, 1 min, 2 min, … then every 6
// hours, some twenty attempts in all.
var DefaultSchedule = Schedule{First: 30 * time.Second, Longest: 6 * time.Hour, MaxAge: 72 * time.Hour}

// Next returns when to try again a delivery queued at queued whose attempt
// number attempts failed at now (jitter in [-1, 1) spreads the retries of
// many), or false when its time is up.
func (s Schedule) Next(queued, now time.Time, attempts int, jitter float64) (time.Time, bool) {
	d := s.First
	for i := 1; i < attempts && d < s.Longest; i++ {
		d *= 2
	}
	d = min(d, s.Longest)
	d += time.Duration(float64(d) * jitter / 10)
	at := now.Add(d)
	if !at.Before(queued.Add(s.MaxAge)) {
		if now.Before(queued.Add(s.MaxAge)) {
			return queued.Add(s.MaxAge), true // one last try at the end
		}
		return time.Time{}, false
	}
	return at, true
}

// Check refuses a schedule that never retries or never ends.
func (s Schedule) Check() error {
	if s.First <= 0 || s.Longest < s.First || s.MaxAge < s.First {
		return fmt.Errorf("webhooks: schedule %v…%v for %v: give 0 < first ≤ longest and first ≤ max age", s.First, s.Longest, s.MaxAge)
	}
	return nil
}
