package dashboard

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/promcheck"
)

// AlertSource is what the alert history polls: a Prometheus evaluating
// paymesh's alert rules (*promcheck.Server).
type AlertSource interface {
	Alerts(ctx context.Context) ([]promcheck.Alert, error)
}

var _ AlertSource = (*promcheck.Server)(nil)

// AlertState is one alert of the history: a rule's alert for one region
// and topic, pending or firing now, or fired and cleared since.
type AlertState struct {
	Name   string `json:"name"`
	Region string `json:"region,omitempty"`
	Topic  string `json:"topic,omitempty"`
	// State is "pending" or "firing" while the alert is active, "cleared"
	// once a fired alert is no longer active.
	State string `json:"state"`
	// Since is when the alert's condition began to hold (Prometheus's
	// activeAt).
	Since time.Time `json:"since"`
	// FiredAt is when the history first saw it firing (zero if it has not
	// fired); ClearedAt when it saw it gone after firing.
	FiredAt   time.Time `json:"fired_at,omitzero"`
	ClearedAt time.Time `json:"cleared_at,omitzero"`
	// Summary is the rule's summary annotation.
	Summary string `json:"summary,omitempty"`
}

// Alerts is what /api/alerts returns: whether alerts are evaluated at all
// (Note says why not, or where), the active ones and those that fired and
// cleared, oldest first.
type Alerts struct {
	Enabled bool         `json:"enabled"`
	Note    string       `json:"note"`
	Error   string       `json:"error,omitempty"` // of the last poll
	Active  []AlertState `json:"active"`
	Cleared []AlertState `json:"cleared"`
}

// AlertHistory polls an AlertSource and keeps the alerts that are active
// and those that fired and cleared since it started (at most keepCleared
// of them). Its zero value is not usable: use NewAlertHistory or
// AlertsOff.
type AlertHistory struct {
	src  AlertSource
	note string

	mu      sync.Mutex
	err     error
	active  map[string]*AlertState // by name and labels
	cleared []AlertState
}

// keepCleared bounds the cleared alerts an AlertHistory keeps.
const keepCleared = 100

// NewAlertHistory returns a history of src's alerts; note says where they
// come from (a Prometheus's URL). Run or Poll fill it.
func NewAlertHistory(src AlertSource, note string) *AlertHistory {
	return &AlertHistory{src: src, note: note, active: map[string]*AlertState{}}
}

// AlertsOff returns a history that stays empty, its note saying why no
// alerts are evaluated.
func AlertsOff(note string) *AlertHistory { return &AlertHistory{note: note} }

// Enabled reports whether the history polls a source.
func (h *AlertHistory) Enabled() bool { return h.src != nil }

// Run polls the source every interval until ctx ends.
func (h *AlertHistory) Run(ctx context.Context, interval time.Duration) {
	if h.src == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		h.Poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll asks the source once and updates the history: new alerts become
// active, active ones take their new state, and an alert that fired and
// is gone moves to the cleared ones (one that was only pending is
// dropped). A failed poll keeps the history as it was and records the
// error.
func (h *AlertHistory) Poll(ctx context.Context) {
	if h.src == nil {
		return
	}
	as, err := h.src.Alerts(ctx)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = err
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, a := range as {
		k := alertKey(a)
		seen[k] = true
		st := h.active[k]
		if st == nil {
			st = &AlertState{Name: a.Name, Region: a.Labels["region"], Topic: a.Labels["topic"], Summary: a.Annotations["summary"]}
			h.active[k] = st
		}
		st.State, st.Since = a.State, a.ActiveAt
		if a.State == "firing" && st.FiredAt.IsZero() {
			st.FiredAt = now
		}
	}
	for k, st := range h.active {
		if seen[k] {
			continue
		}
		delete(h.active, k)
		if !st.FiredAt.IsZero() {
			st.State, st.ClearedAt = "cleared", now
			h.cleared = append(h.cleared, *st)
		}
	}
	if len(h.cleared) > keepCleared {
		h.cleared = slices.Delete(h.cleared, 0, len(h.cleared)-keepCleared)
	}
}

// alertKey identifies an alert by its rule and labels.
func alertKey(a promcheck.Alert) string {
	k := a.Name
	for _, l := range slices.Sorted(maps.Keys(a.Labels)) {
		k += "\x00" + l + "=" + a.Labels[l]
	}
	return k
}

// Snapshot returns the history so far: active alerts ordered by when they
// began, cleared ones by when they cleared.
func (h *AlertHistory) Snapshot() Alerts {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := Alerts{Enabled: h.src != nil, Note: h.note, Active: []AlertState{}, Cleared: slices.Clone(h.cleared)}
	if out.Cleared == nil {
		out.Cleared = []AlertState{}
	}
	if h.err != nil {
		out.Error = h.err.Error()
	}
	for _, st := range h.active {
		out.Active = append(out.Active, *st)
	}
	slices.SortFunc(out.Active, func(a, b AlertState) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Region, b.Region), cmp.Compare(a.Topic, b.Topic))
	})
	return out
}
