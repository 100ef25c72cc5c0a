package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/promcheck"
)

// The values of Config.Prometheus.
const (
	PrometheusAuto = "auto" // run Prometheus when it is installed
	PrometheusOn   = "on"   // run Prometheus; the demo fails without it
	PrometheusOff  = "off"  // run none
)

// PrometheusConfigFile is the Prometheus config of docker-compose.yml,
// relative to the repository; its alert rules sit beside it.
const PrometheusConfigFile = "deploy/prometheus/prometheus.yml"

// The demo's Prometheus scrapes and evaluates the rules every second, and
// the alert history asks it for its alerts every two.
const (
	promInterval = time.Second
	alertPoll    = 2 * time.Second
)

// AlertsReport is what the report says of the alert rules: whether a
// Prometheus evaluated them (Note says where, or why not) and the alerts
// that fired during the run, cleared or still firing.
type AlertsReport struct {
	On    bool
	Note  string
	Fired []dashboard.AlertState
}

// prometheus is the demo's Prometheus and the history of its alerts; with
// none, the history is off and says why.
type prometheus struct {
	srv     *promcheck.Server
	history *dashboard.AlertHistory
}

// checkPrometheus validates cfg's Prometheus mode before anything starts,
// and returns the config file to run ("" with a reason to run none). It
// returns an error for an unknown mode, or when PrometheusOn cannot be
// honoured.
func checkPrometheus(cfg Config) (file, off string, err error) {
	switch cfg.Prometheus {
	case "", PrometheusOff:
		return "", "Prometheus off", nil
	case PrometheusAuto, PrometheusOn:
	default:
		return "", "", fmt.Errorf("prometheus %q: want %s, %s or %s", cfg.Prometheus, PrometheusAuto, PrometheusOn, PrometheusOff)
	}
	if err := promcheck.Installed(); err != nil {
		if cfg.Prometheus == PrometheusOn {
			return "", "", fmt.Errorf("the demo's alerts: %w; make prometheus installs it", err)
		}
		return "", "prometheus not installed; make prometheus", nil
	}
	file = cfg.PrometheusConfig
	if file == "" {
		if file, err = findPrometheusConfig(); err != nil && cfg.Prometheus == PrometheusAuto {
			return "", err.Error(), nil
		}
	} else if _, err = os.Stat(file); err != nil {
		err = fmt.Errorf("prometheus config: %w", err)
	}
	if err != nil {
		return "", "", fmt.Errorf("the demo's alerts: %w", err)
	}
	return file, "", nil
}

// findPrometheusConfig returns PrometheusConfigFile in the working
// directory or the nearest one above it, or an error saying it is not
// there (the binary runs outside the repository).
func findPrometheusConfig() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		p := filepath.Join(d, filepath.FromSlash(PrometheusConfigFile))
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no %s in %s or above it: run the demo from the repository", PrometheusConfigFile, wd)
		}
	}
}

// startPrometheus runs Prometheus on file with its scrape targets mapped
// to the cluster's /metrics (compose's receiver to receiver, the demo's
// receiver's /metrics URL; dropped when ""), and starts polling its alerts
// until ctx ends.
// With file "" it returns a history that is off, saying why. It returns an
// error when Prometheus does not start or a target is none of the
// cluster's services.
func startPrometheus(ctx context.Context, c *cluster.Cluster, receiver, file, off string, out io.Writer) (*prometheus, error) {
	if file == "" {
		fmt.Fprintf(out, "alerts: off (%s)\n", off)
		return &prometheus{history: dashboard.AlertsOff(off)}, nil
	}
	var mapErr error
	srv, err := promcheck.Start(ctx, promcheck.Options{ConfigFile: file, ScrapeInterval: promInterval, EvaluationInterval: promInterval,
		Map: func(target string) string {
			if host, _, _ := strings.Cut(target, ":"); host == receiverTarget {
				u, _ := url.Parse(receiver)
				if u == nil {
					return ""
				}
				return u.Host
			}
			to, err := metricsTarget(c, target)
			if err != nil {
				mapErr = errors.Join(mapErr, err)
			}
			return to
		}})
	if err != nil {
		return nil, fmt.Errorf("the demo's Prometheus: %w", err)
	}
	if mapErr != nil {
		srv.Stop()
		return nil, fmt.Errorf("the demo's Prometheus, %s: %w", file, mapErr)
	}
	note := "Prometheus " + srv.URL()
	fmt.Fprintf(out, "  Prometheus: %s (alert rules beside %s, scraping the /metrics above every %s)\n", srv.URL(), file, promInterval)
	p := &prometheus{srv: srv, history: dashboard.NewAlertHistory(srv, note)}
	go p.history.Run(ctx, alertPoll)
	return p, nil
}

// receiverTarget is the scrape target's host of compose's reference
// receiver.
const receiverTarget = "receiver"

// metricsTarget maps a scrape target of the compose config
// ("ledger-eu:9101": a service and its region) to the host:port of that
// service's /metrics in the cluster. It returns an error for a target
// that names no service of the cluster.
func metricsTarget(c *cluster.Cluster, target string) (string, error) {
	host, _, _ := strings.Cut(target, ":")
	service, region, _ := strings.Cut(host, "-")
	r := c.Region(region)
	if r == nil {
		return "", fmt.Errorf("scrape target %q: no region %q in the demo", target, region)
	}
	var metrics string
	switch service {
	case "ledger":
		metrics = r.LedgerMetricsURL
	case "router":
		metrics = r.RouterMetricsURL
	case "api":
		metrics = r.APIMetricsURL
	default:
		return "", fmt.Errorf("scrape target %q: no service %q (ledger, router or api)", target, service)
	}
	u, err := url.Parse(metrics)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("scrape target %q: %s of region %s serves no /metrics (%q)", target, service, region, metrics)
	}
	return u.Host, nil
}

// report polls the alerts a last time and returns what fired, in the
// order it fired.
func (p *prometheus) report(ctx context.Context) AlertsReport {
	p.history.Poll(ctx)
	a := p.history.Snapshot()
	rep := AlertsReport{On: a.Enabled, Note: a.Note, Fired: []dashboard.AlertState{}}
	for _, s := range a.Active {
		if !s.FiredAt.IsZero() {
			rep.Fired = append(rep.Fired, s)
		}
	}
	rep.Fired = append(rep.Fired, a.Cleared...)
	slices.SortStableFunc(rep.Fired, func(a, b dashboard.AlertState) int { return a.FiredAt.Compare(b.FiredAt) })
	return rep
}

// stop stops Prometheus, if one runs.
func (p *prometheus) stop() {
	if p.srv != nil {
		p.srv.Stop()
	}
}

// print writes the alerts part of the report.
func (r AlertsReport) print(w io.Writer) {
	if !r.On {
		fmt.Fprintf(w, "alerts: off (%s)\n", r.Note)
		return
	}
	if len(r.Fired) == 0 {
		fmt.Fprintf(w, "alerts fired: none (%s)\n", r.Note)
		return
	}
	fmt.Fprintf(w, "alerts fired (%s):\n", r.Note)
	for _, a := range r.Fired {
		end := "still firing"
		if !a.ClearedAt.IsZero() {
			end = "cleared " + a.ClearedAt.Format(time.TimeOnly)
		}
		fmt.Fprintf(w, "  %-30s region %-3s topic %-9s fired %s, %s\n", a.Name, a.Region, a.Topic, a.FiredAt.Format(time.TimeOnly), end)
	}
}
