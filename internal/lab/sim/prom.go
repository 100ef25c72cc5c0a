package sim

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/promcheck"
)

// The alert the degraded link must fire and clear, and the dashboard the
// panel queries come from (the file compose's grafana mounts).
const (
	duplicateAlert   = "PaymeshDuplicateRateHigh"
	dashboardFile    = "deploy/grafana/paymesh.json"
	prometheusConfig = "/etc/prometheus/prometheus.yml" // where compose mounts the config
	scrapeInterval   = time.Second
	alertPoll        = 2 * time.Second
	alertClearWait   = 75 * time.Second
	// routerAckWait is how long the routers wait for a PubAck before they
	// publish again (paymesh router --ack-wait's default): duplicates of
	// a degraded link land up to this long after it.
	routerAckWait = 10 * time.Second
	// alertWindow is the duplicate-rate alert's rate window
	// (deploy/prometheus/alerts.yml).
	alertWindow = 30 * time.Second
)

// alerts records every alert seen firing, polled from Prometheus.
type alerts struct {
	mu     sync.Mutex
	seen   map[string]*AlertSeen // by name and labels
	firing map[string]bool       // at the last poll
	err    error                 // of the last poll
	// panels are the dashboard queries without data the first time an
	// alert was pending or firing (nil until then).
	panels  map[promcheck.PanelQuery]bool
	checked bool
}

func alertKey(a promcheck.Alert) string { return a.Name + labels(a.Labels) }

// startPrometheus runs Prometheus on compose's config, its targets mapped
// to loopback, scraping every second, and polls its alerts until ctx ends.
func (s *sim) startPrometheus(ctx context.Context) error {
	names := s.plan.of(kindPrometheus)
	if len(names) != 1 {
		return fmt.Errorf("sim: want one prometheus service in docker-compose.yml, found %d", len(names))
	}
	svc := s.plan.project.Services[names[0]]
	v, ok := svc.Mount(prometheusConfig)
	if !ok {
		return fmt.Errorf("sim: %s mounts no %s", names[0], prometheusConfig)
	}
	listen, err := s.mapper.Addr(names[0] + ":9090")
	if err != nil {
		return err
	}
	var mapErr error
	srv, err := promcheck.Start(ctx, promcheck.Options{ConfigFile: v.Source, Dir: filepath.Join(s.dir, "prometheus"), Listen: listen,
		ScrapeInterval: scrapeInterval, EvaluationInterval: scrapeInterval,
		Map: func(target string) string {
			to, err := s.mapper.Addr(target)
			if err != nil && mapErr == nil {
				mapErr = err
			}
			return to
		}})
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	s.prom = srv
	if mapErr != nil {
		return fmt.Errorf("sim: prometheus targets: %w", mapErr)
	}
	s.logf("Prometheus: %s (config %s mapped to loopback, scraping every %s; data in %s)", srv.URL(), v.Source, scrapeInterval, srv.Dir())
	s.alerts = &alerts{seen: map[string]*AlertSeen{}, firing: map[string]bool{}}
	go s.pollAlerts(ctx)
	return nil
}

// pollAlerts asks Prometheus for its alerts every alertPoll until ctx ends.
func (s *sim) pollAlerts(ctx context.Context) {
	for {
		s.pollAlertsOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(alertPoll):
		}
	}
}

func (s *sim) pollAlertsOnce(ctx context.Context) {
	as, err := s.prom.Alerts(ctx)
	s.alerts.mu.Lock()
	defer s.alerts.mu.Unlock()
	s.alerts.err = err
	if err != nil {
		return
	}
	if len(as) > 0 && !s.alerts.checked {
		s.alerts.checked = true
		go s.checkPanelsNow(ctx)
	}
	now := map[string]bool{}
	for _, a := range as {
		if a.State != "firing" {
			continue
		}
		k := alertKey(a)
		now[k] = true
		if s.alerts.seen[k] == nil {
			s.alerts.seen[k] = &AlertSeen{Name: a.Name, Labels: a.Labels, Fired: true, FiredAt: time.Now()}
		}
	}
	for k, a := range s.alerts.seen {
		switch {
		case now[k]:
			a.Cleared, a.ClearedAt = false, time.Time{}
		case !a.Cleared:
			a.Cleared, a.ClearedAt = true, time.Now()
		}
	}
	s.alerts.firing = now
}

// firingNow lists the alerts firing at the last poll.
func (s *sim) firingNow() string {
	if s.alerts == nil {
		return "-"
	}
	s.alerts.mu.Lock()
	defer s.alerts.mu.Unlock()
	if s.alerts.err != nil {
		return "? (" + s.alerts.err.Error() + ")"
	}
	if len(s.alerts.firing) == 0 {
		return "none firing"
	}
	return strings.Join(slices.Sorted(func(yield func(string) bool) {
		for k := range s.alerts.firing {
			if !yield(k) {
				return
			}
		}
	}), " ")
}

// waitAlert waits until an alert named name has fired for region (at
// most until notAfter, when the duplicates of a degraded link have all
// landed and left the alert's window), then until it no longer fires (at
// most alertClearWait).
func (s *sim) waitAlert(ctx context.Context, name, region string, notAfter time.Time) {
	state := func() (fired, firing bool) {
		s.pollAlertsOnce(ctx)
		s.alerts.mu.Lock()
		defer s.alerts.mu.Unlock()
		for k, a := range s.alerts.seen {
			if a.Name == name && a.Labels["region"] == region {
				fired = true
				firing = firing || s.alerts.firing[k]
			}
		}
		return fired, firing
	}
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(alertPoll):
			return true
		}
	}
	for fired, _ := state(); !fired && time.Now().Before(notAfter); fired, _ = state() {
		if !wait() {
			return
		}
	}
	deadline := time.Now().Add(alertClearWait)
	for _, firing := state(); firing && time.Now().Before(deadline); _, firing = state() {
		if !wait() {
			return
		}
	}
}

// sumByRegion sums the increase of each metric by region over the span
// [from, to], read now.
func (s *sim) sumByRegion(ctx context.Context, from, to time.Time, metrics ...string) (map[string]float64, error) {
	window := int(math.Ceil(to.Sub(from).Seconds()))
	offset := int(time.Since(to).Seconds())
	out := map[string]float64{}
	if window <= 0 {
		return out, nil
	}
	for _, m := range metrics {
		expr := fmt.Sprintf("sum by (region) (increase(%s[%ds]))", m, window)
		if offset > 0 {
			expr = fmt.Sprintf("sum by (region) (increase(%s[%ds] offset %ds))", m, window, offset)
		}
		res, err := s.prom.Query(ctx, expr)
		if err != nil {
			return nil, err
		}
		for _, r := range res {
			out[r.Metric["region"]] += r.Value
		}
	}
	return out, nil
}

// duplicateRate returns duplicates per delivery by region over the span
// [from, to]: the ledgers' and the routers' (as the alert rules count
// them), over the ledgers' deliveries and the acked publishes of the
// routers and of the ledgers (their saga steps).
func (s *sim) duplicateRate(ctx context.Context, from, to time.Time) (map[string]float64, error) {
	dups, err := s.sumByRegion(ctx, from, to, "paymesh_duplicates_total", "paymesh_router_duplicates_total")
	if err != nil {
		return nil, err
	}
	dels, err := s.sumByRegion(ctx, from, to, "paymesh_deliveries_total", "paymesh_router_submitted_total", "paymesh_router_forwarded_total", "paymesh_router_relayed_total",
		"paymesh_saga_steps_sent_total")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for r, d := range dels {
		if d > 0 {
			out[r] = dups[r] / d
		}
	}
	return out, nil
}

// rates returns the duplicate rate by region before the degraded link,
// while it was degraded (and for the routers' ack wait after, when their
// retries land), and after; only the whole run when it did not run.
func (s *sim) rates(ctx context.Context, loadStart time.Time, degraded [2]time.Time) (map[string]map[string]float64, error) {
	now := time.Now()
	spans := map[string][2]time.Time{"whole run": {loadStart, now}}
	if !degraded[1].IsZero() {
		settle := degraded[1].Add(routerAckWait)
		spans = map[string][2]time.Time{"1 before degrade": {loadStart, degraded[0]}, "2 while degraded": {degraded[0], settle}, "3 after": {settle, now}}
	}
	out := map[string]map[string]float64{}
	for label, span := range spans {
		rates, err := s.duplicateRate(ctx, span[0], span[1])
		if err != nil {
			return nil, err
		}
		for r, v := range rates {
			if out[r] == nil {
				out[r] = map[string]float64{}
			}
			out[r][label] = v
		}
	}
	return out, nil
}

// observe reads the duplicates by region and layer over the run, waits
// for the duplicate-rate alert to clear when the degraded link ran, and
// checks every dashboard panel query.
func (s *sim) observe(ctx context.Context, rep *Report, since time.Time) error {
	if slices.Contains(rep.Fired, FaultDegrade) {
		rep.WantAlert, rep.AlertRequired = duplicateAlert, !s.cfg.Quick
		s.mu.Lock()
		settled := s.degraded[1].Add(routerAckWait + alertWindow)
		s.mu.Unlock()
		s.waitAlert(ctx, duplicateAlert, "us", settled)
	}
	s.pollAlertsOnce(ctx)
	window := fmt.Sprintf("%ds", int(math.Ceil(time.Since(since).Seconds())))
	rep.Duplicates = map[string]map[string]float64{}
	var err error
	for _, m := range []string{"paymesh_duplicates_total", "paymesh_router_duplicates_total"} {
		var res []promcheck.Sample
		res, err = s.prom.Query(ctx, fmt.Sprintf("sum by (region, layer) (increase(%s[%s]))", m, window))
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		for _, r := range res {
			if rep.Duplicates[r.Metric["region"]] == nil {
				rep.Duplicates[r.Metric["region"]] = map[string]float64{}
			}
			// increase() extrapolates to the window's edges: round.
			rep.Duplicates[r.Metric["region"]][r.Metric["layer"]] += math.Round(r.Value)
		}
	}
	s.mu.Lock()
	degraded := s.degraded
	s.mu.Unlock()
	rep.DegradedFrom, rep.DegradedTo = degraded[0], degraded[1]
	if rep.DuplicateRate, err = s.rates(ctx, since, degraded); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	s.explainDuplicates(ctx, rep, since)
	s.alerts.mu.Lock()
	for _, a := range s.alerts.seen {
		rep.Alerts = append(rep.Alerts, *a)
	}
	s.alerts.mu.Unlock()
	qs, err := promcheck.PanelQueries(filepath.Join(s.cfg.Root, dashboardFile))
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	rep.PanelsChecked = len(qs)
	fails, err := s.prom.CheckPanels(ctx, filepath.Join(s.cfg.Root, dashboardFile))
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	// A panel passes if its query returned data at the end or while an
	// alert was active (the alert panels show data only then).
	s.alerts.mu.Lock()
	during := s.alerts.panels
	s.alerts.mu.Unlock()
	for _, f := range fails {
		switch {
		case during == nil && strings.Contains(f.Query.Expr, "ALERTS"):
			// ALERTS has series only while an alert is pending or firing.
			rep.PanelsUnchecked = append(rep.PanelsUnchecked, f.Query.Panel+" (no alert was pending or firing during the run)")
		case strings.Contains(f.Query.Expr, "ALERTS") && s.hadData(ctx, f.Query.Expr):
			// The alert cleared before the panels were read, twice: what
			// Prometheus stored while it was active is the panel's data.
		case during == nil || during[f.Query]:
			rep.PanelsEmpty = append(rep.PanelsEmpty, f.Error())
		}
	}
	return nil
}

// hadData reports whether a panel's query returned data at any time in
// the last hour (a subquery over the stored samples): an alert panel's
// ALERTS series exist only while the alert is pending or firing, and a
// short run's alert may clear within seconds.
func (s *sim) hadData(ctx context.Context, expr string) bool {
	res, err := s.prom.Query(ctx, "last_over_time(("+expr+")[1h:5s])")
	return err == nil && len(res) > 0
}

// checkPanelsNow runs the dashboard's panel queries once while an alert
// is pending or firing, keeping the ones that returned no data.
func (s *sim) checkPanelsNow(ctx context.Context) {
	fails, err := s.prom.CheckPanels(ctx, filepath.Join(s.cfg.Root, dashboardFile))
	if err != nil {
		return
	}
	empty := map[promcheck.PanelQuery]bool{}
	for _, f := range fails {
		empty[f.Query] = true
	}
	s.alerts.mu.Lock()
	s.alerts.panels = empty
	s.alerts.mu.Unlock()
}
