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

	"github.com/paymesh/paymesh/internal/promcheck"
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
)

// alerts records every alert seen firing, polled from Prometheus.
type alerts struct {
	mu     sync.Mutex
	seen   map[string]*AlertSeen // by name and labels
	firing map[string]bool       // at the last poll
	err    error                 // of the last poll
	// panels are the dashboard queries without data the first time an
	// alert fired (nil until then).
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
	now := map[string]bool{}
	for _, a := range as {
		if a.State != "firing" {
			continue
		}
		k := alertKey(a)
		now[k] = true
		if s.alerts.seen[k] == nil {
			s.alerts.seen[k] = &AlertSeen{Name: a.Name, Labels: a.Labels, Fired: true}
		}
	}
	if len(now) > 0 && !s.alerts.checked {
		s.alerts.checked = true
		go s.checkPanelsNow(ctx)
	}
	for k, a := range s.alerts.seen {
		a.Cleared = !now[k]
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

// waitAlertCleared waits, at most alertClearWait, until no alert named
// name fires for region.
func (s *sim) waitAlertCleared(ctx context.Context, name, region string) {
	deadline := time.Now().Add(alertClearWait)
	for time.Now().Before(deadline) {
		s.pollAlertsOnce(ctx)
		s.alerts.mu.Lock()
		firing := false
		for k := range s.alerts.firing {
			a := s.alerts.seen[k]
			firing = firing || (a.Name == name && a.Labels["region"] == region)
		}
		s.alerts.mu.Unlock()
		if !firing {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(alertPoll):
		}
	}
}

// sumByRegion sums the increase of each metric over window by region.
func (s *sim) sumByRegion(ctx context.Context, window time.Duration, metrics ...string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, m := range metrics {
		res, err := s.prom.Query(ctx, fmt.Sprintf("sum by (region) (increase(%s[%ds]))", m, int(math.Ceil(window.Seconds()))))
		if err != nil {
			return nil, err
		}
		for _, r := range res {
			out[r.Metric["region"]] += r.Value
		}
	}
	return out, nil
}

// duplicateRate returns duplicates per delivery by region over the last
// window: the ledgers' and the routers' (the alert rules' definition).
func (s *sim) duplicateRate(ctx context.Context, window time.Duration) (map[string]float64, error) {
	dups, err := s.sumByRegion(ctx, window, "paymesh_duplicates_total", "paymesh_router_duplicates_total")
	if err != nil {
		return nil, err
	}
	dels, err := s.sumByRegion(ctx, window, "paymesh_deliveries_total", "paymesh_router_submitted_total", "paymesh_router_forwarded_total", "paymesh_router_relayed_total")
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

// noteRate stores the duplicate rate over the last window under label.
func (s *sim) noteRate(ctx context.Context, label string, window time.Duration) {
	rates, err := s.duplicateRate(ctx, window)
	if err != nil {
		s.logf("duplicate rate %s: %v", label, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for r, v := range rates {
		if s.rates[r] == nil {
			s.rates[r] = map[string]float64{}
		}
		s.rates[r][label] = v
	}
}

// observe reads the duplicates by region and layer over the run, waits
// for the duplicate-rate alert to clear when the degraded link ran, and
// checks every dashboard panel query.
func (s *sim) observe(ctx context.Context, rep *Report, since time.Time) error {
	if slices.Contains(rep.Fired, FaultDegrade) {
		rep.WantAlert = duplicateAlert
		s.waitAlertCleared(ctx, duplicateAlert, "us")
	}
	s.pollAlertsOnce(ctx)
	window := fmt.Sprintf("%ds", int(math.Ceil(time.Since(since).Seconds())))
	rep.Duplicates = map[string]map[string]float64{}
	for _, m := range []string{"paymesh_duplicates_total", "paymesh_router_duplicates_total"} {
		res, err := s.prom.Query(ctx, fmt.Sprintf("sum by (region, layer) (increase(%s[%s]))", m, window))
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		for _, r := range res {
			if rep.Duplicates[r.Metric["region"]] == nil {
				rep.Duplicates[r.Metric["region"]] = map[string]float64{}
			}
			rep.Duplicates[r.Metric["region"]][r.Metric["layer"]] += r.Value
		}
	}
	s.mu.Lock()
	rep.DuplicateRate = s.rates
	s.mu.Unlock()
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
	// alert fired (the alert panels show data only then).
	s.alerts.mu.Lock()
	during := s.alerts.panels
	s.alerts.mu.Unlock()
	for _, f := range fails {
		if during == nil || during[f.Query] {
			rep.PanelsEmpty = append(rep.PanelsEmpty, f.Error())
		}
	}
	return nil
}

// checkPanelsNow runs the dashboard's panel queries once while an alert
// fires, keeping the ones that returned no data.
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
