package promcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// PanelQuery is one target expression of a dashboard panel, with the
// dashboard's variables substituted.
type PanelQuery struct {
	Panel string // the panel's title
	Expr  string
	// Exemplar is the target's "exemplar": whether Grafana asks for the
	// exemplars of its series and draws them.
	Exemplar bool
}

// dashboardPanel is the part of a Grafana panel this package reads; a row
// holds its collapsed panels.
type dashboardPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr     string `json:"expr"`
		Exemplar bool   `json:"exemplar"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

// The values Grafana's built-in interval variables get in PanelQueries.
var builtins = map[string]string{"__rate_interval": "1m", "__interval": "1m", "__range": "5m"}

// PanelQueries returns every target expression of every panel of the
// Grafana dashboard at path, rows' panels included, with each template
// variable ($region, ${region}, [[region]]) replaced by ".*" (all values,
// as in a regex matcher) and Grafana's interval variables by fixed
// durations. It returns an error when the file cannot be read, is not a
// dashboard, or has a panel target without an expression.
func PanelQueries(path string) ([]PanelQuery, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("promcheck: %w", err)
	}
	var d struct {
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("promcheck: %s: %w", path, err)
	}
	if len(d.Panels) == 0 {
		return nil, fmt.Errorf("promcheck: %s: no panels", path)
	}
	vars := map[string]string{}
	for k, v := range builtins {
		vars[k] = v
	}
	for _, v := range d.Templating.List {
		vars[v.Name] = ".*"
	}
	var out []PanelQuery
	var walk func(ps []dashboardPanel) error
	walk = func(ps []dashboardPanel) error {
		for _, p := range ps {
			for i, t := range p.Targets {
				if strings.TrimSpace(t.Expr) == "" {
					return fmt.Errorf("promcheck: %s: panel %q: target %d has no expression", path, p.Title, i)
				}
				out = append(out, PanelQuery{Panel: p.Title, Expr: substitute(t.Expr, vars), Exemplar: t.Exemplar})
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	return out, nil
}

// variable matches a Grafana variable reference: $name, ${name} (with an
// optional :format) or [[name]].
var variable = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)`)

func substitute(expr string, vars map[string]string) string {
	return variable.ReplaceAllStringFunc(expr, func(ref string) string {
		m := variable.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if v, ok := vars[name]; ok {
			return v
		}
		return ref
	})
}

// Failure is a panel query that returned no data or an error.
type Failure struct {
	Query PanelQuery
	Err   error
}

// ErrNoData is a Failure's error when a query returned no series.
var ErrNoData = errors.New("no data")

func (f Failure) Error() string {
	return fmt.Sprintf("panel %q: %s: %v", f.Query.Panel, f.Query.Expr, f.Err)
}

// CheckPanels evaluates every panel query of the dashboard at path (see
// PanelQueries) and returns the ones that returned no data (ErrNoData) or
// an error. It returns an error only when the dashboard cannot be read.
func (s *Server) CheckPanels(ctx context.Context, path string) ([]Failure, error) {
	qs, err := PanelQueries(path)
	if err != nil {
		return nil, err
	}
	var out []Failure
	for _, q := range qs {
		res, err := s.Query(ctx, q.Expr)
		switch {
		case err != nil:
			out = append(out, Failure{q, err})
		case len(res) == 0:
			out = append(out, Failure{q, ErrNoData})
		}
	}
	return out, nil
}

// Errors of CheckExemplars' failures.
var (
	// ErrExemplarOff is a Failure's error when a query of the metric does
	// not ask for exemplars ("exemplar": true missing).
	ErrExemplarOff = errors.New(`exemplars off: the target lacks "exemplar": true`)
	// ErrNoExemplars is a Failure's error when Prometheus keeps no
	// exemplar with a trace_id (what Grafana links to Jaeger by) for the
	// series a query selects.
	ErrNoExemplars = errors.New("no exemplars with a trace_id")
)

// ExemplarWindow is how far back CheckExemplars looks for exemplars.
const ExemplarWindow = 5 * time.Minute

// MetricQueries returns the panel queries of the dashboard at path (see
// PanelQueries) that read metric (a metric name, or its series' name such
// as x_bucket). It returns an error when the dashboard cannot be read or
// no query reads metric.
func MetricQueries(path, metric string) ([]PanelQuery, error) {
	qs, err := PanelQueries(path)
	if err != nil {
		return nil, err
	}
	reads := regexp.MustCompile(`\b` + regexp.QuoteMeta(metric) + `\b`)
	var out []PanelQuery
	for _, q := range qs {
		if reads.MatchString(q.Expr) {
			out = append(out, q)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("promcheck: %s: no panel query reads %s", path, metric)
	}
	return out, nil
}

// CheckExemplars checks the panel queries of the dashboard at path that
// read metric (see MetricQueries): each must ask Grafana for exemplars
// (else ErrExemplarOff), and Prometheus must keep exemplars with a
// trace_id for the series it selects over the last ExemplarWindow (else
// ErrNoExemplars). It
// returns the failures, or an error when the dashboard cannot be read or
// no query reads metric.
func (s *Server) CheckExemplars(ctx context.Context, path, metric string) ([]Failure, error) {
	qs, err := MetricQueries(path, metric)
	if err != nil {
		return nil, err
	}
	var out []Failure
	for _, q := range qs {
		if !q.Exemplar {
			out = append(out, Failure{q, ErrExemplarOff})
			continue
		}
		ex, err := s.Exemplars(ctx, q.Expr, ExemplarWindow)
		switch {
		case err != nil:
			out = append(out, Failure{q, err})
		case !slices.ContainsFunc(ex, func(e Exemplar) bool { return e.Labels["trace_id"] != "" }):
			out = append(out, Failure{q, ErrNoExemplars})
		}
	}
	return out, nil
}
