// Package promcheck runs a real Prometheus (Debian's prometheus binary) on
// a copy of deploy/prometheus/prometheus.yml whose scrape targets are
// mapped to where the services really listen, and asks it questions: PromQL
// queries, alert states, and whether every panel query of the Grafana
// dashboard returns data. It also runs promtool on the config and rules.
package promcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
)

// Binaries are the programs this package runs, from Debian's prometheus
// package (scripts/prometheus installs it).
const (
	PrometheusBinary = "prometheus"
	PromtoolBinary   = "promtool"
)

// Installed returns an error naming the missing binaries unless both
// prometheus and promtool are on PATH.
func Installed() error {
	var missing []string
	for _, b := range []string{PrometheusBinary, PromtoolBinary} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("promcheck: %s not installed (scripts/prometheus installs Debian's prometheus package)", strings.Join(missing, " and "))
	}
	return nil
}

// Options configures a Prometheus run.
type Options struct {
	// ConfigFile is the Prometheus config to run a mapped copy of
	// (required), e.g. deploy/prometheus/prometheus.yml.
	ConfigFile string
	// RulesDir is where the config's relative rule_files are read from;
	// the default is ConfigFile's directory.
	RulesDir string
	// Map maps each static scrape target (host:port, as written in the
	// config) to the address to scrape. An empty result drops the target,
	// and a job left without targets is dropped. Nil keeps every target.
	Map func(target string) string
	// Dir holds the mapped config, the TSDB and the log; the default is a
	// fresh temporary directory that Stop removes.
	Dir string
	// Listen is the web listen address; the default is a free loopback
	// port.
	Listen string
	// ScrapeInterval and EvaluationInterval override the config's global
	// ones when set (tests use 1s).
	ScrapeInterval     time.Duration
	EvaluationInterval time.Duration
	// ReadyTimeout bounds the wait for /-/ready (default 30s).
	ReadyTimeout time.Duration
}

// WriteConfig writes to dst the config of o.ConfigFile with its targets
// mapped by o.Map, its intervals overridden and its rule files made
// absolute (under o.RulesDir). It returns an error when the config cannot
// be read or is not a Prometheus config.
func WriteConfig(o Options, dst string) error {
	if o.ConfigFile == "" {
		return errors.New("promcheck: no config file given")
	}
	b, err := os.ReadFile(o.ConfigFile)
	if err != nil {
		return fmt.Errorf("promcheck: %w", err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("promcheck: %s: %w", o.ConfigFile, err)
	}
	if cfg == nil {
		return fmt.Errorf("promcheck: %s: empty config", o.ConfigFile)
	}
	rulesDir := o.RulesDir
	if rulesDir == "" {
		rulesDir = filepath.Dir(o.ConfigFile)
	}
	if rulesDir, err = filepath.Abs(rulesDir); err != nil {
		return fmt.Errorf("promcheck: %w", err)
	}
	if err := overrideGlobal(cfg, o); err != nil {
		return fmt.Errorf("promcheck: %s: %w", o.ConfigFile, err)
	}
	if err := absRules(cfg, rulesDir); err != nil {
		return fmt.Errorf("promcheck: %s: %w", o.ConfigFile, err)
	}
	if err := mapTargets(cfg, o.Map); err != nil {
		return fmt.Errorf("promcheck: %s: %w", o.ConfigFile, err)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("promcheck: %w", err)
	}
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		return fmt.Errorf("promcheck: %w", err)
	}
	return nil
}

func overrideGlobal(cfg map[string]any, o Options) error {
	if o.ScrapeInterval <= 0 && o.EvaluationInterval <= 0 {
		return nil
	}
	global, ok := cfg["global"].(map[string]any)
	if !ok && cfg["global"] != nil {
		return errors.New("global is not a mapping")
	}
	if global == nil {
		global = map[string]any{}
	}
	if o.ScrapeInterval > 0 {
		global["scrape_interval"] = promDuration(o.ScrapeInterval)
	}
	if o.EvaluationInterval > 0 {
		global["evaluation_interval"] = promDuration(o.EvaluationInterval)
	}
	cfg["global"] = global
	return nil
}

// promDuration writes d in Prometheus's duration syntax (milliseconds).
func promDuration(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

func absRules(cfg map[string]any, dir string) error {
	if cfg["rule_files"] == nil {
		return nil
	}
	files, ok := cfg["rule_files"].([]any)
	if !ok {
		return errors.New("rule_files is not a list")
	}
	for i, f := range files {
		s, ok := f.(string)
		if !ok {
			return fmt.Errorf("rule_files[%d] is not a path", i)
		}
		if !filepath.IsAbs(s) {
			files[i] = filepath.Join(dir, s)
		}
	}
	return nil
}

func mapTargets(cfg map[string]any, m func(string) string) error {
	if m == nil || cfg["scrape_configs"] == nil {
		return nil
	}
	jobs, ok := cfg["scrape_configs"].([]any)
	if !ok {
		return errors.New("scrape_configs is not a list")
	}
	var kept []any
	for i, j := range jobs {
		job, ok := j.(map[string]any)
		if !ok {
			return fmt.Errorf("scrape_configs[%d] is not a mapping", i)
		}
		statics, _ := job["static_configs"].([]any)
		var keptStatics []any
		for _, s := range statics {
			sc, ok := s.(map[string]any)
			if !ok {
				return fmt.Errorf("job %v: a static_configs entry is not a mapping", job["job_name"])
			}
			targets, _ := sc["targets"].([]any)
			var mapped []any
			for _, t := range targets {
				s, ok := t.(string)
				if !ok {
					return fmt.Errorf("job %v: target %v is not host:port", job["job_name"], t)
				}
				if to := m(s); to != "" {
					mapped = append(mapped, to)
				}
			}
			if len(mapped) > 0 {
				sc["targets"] = mapped
				keptStatics = append(keptStatics, sc)
			}
		}
		if len(keptStatics) > 0 {
			job["static_configs"] = keptStatics
			kept = append(kept, job)
		}
	}
	cfg["scrape_configs"] = kept
	return nil
}

// Server is a running Prometheus.
type Server struct {
	url     string
	dir     string
	tempDir bool
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	log     *os.File
	http    *http.Client
}

// Start runs prometheus on a mapped copy of o.ConfigFile (see WriteConfig)
// and waits until it is ready. It returns an error when the binary is
// missing, the config cannot be mapped, or Prometheus exits or is not
// ready within o.ReadyTimeout (the error quotes the end of its log).
func Start(ctx context.Context, o Options) (*Server, error) {
	bin, err := exec.LookPath(PrometheusBinary)
	if err != nil {
		return nil, fmt.Errorf("promcheck: %w (scripts/prometheus installs Debian's prometheus package)", err)
	}
	s := &Server{dir: o.Dir, exited: make(chan struct{}), http: &http.Client{Timeout: 10 * time.Second}}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "paymesh-prometheus-"); err != nil {
			return nil, fmt.Errorf("promcheck: %w", err)
		}
		s.tempDir = true
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("promcheck: %w", err)
	}
	fail := func(err error) (*Server, error) {
		s.Stop()
		return nil, err
	}
	cfgPath := filepath.Join(s.dir, "prometheus.yml")
	if err := WriteConfig(o, cfgPath); err != nil {
		return fail(err)
	}
	listen := o.Listen
	if listen == "" {
		if listen, err = freeLoopback(); err != nil {
			return fail(err)
		}
	}
	if s.log, err = os.Create(filepath.Join(s.dir, "prometheus.log")); err != nil {
		return fail(fmt.Errorf("promcheck: %w", err))
	}
	s.url = "http://" + listen
	// Exemplars kept, as compose's Prometheus keeps them: a duplicate's
	// trace is opened from them.
	s.cmd = exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(s.dir, "data"),
		"--web.listen-address="+listen, "--enable-feature=exemplar-storage")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		return fail(fmt.Errorf("promcheck: start prometheus: %w", err))
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	timeout := o.ReadyTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	if err := s.waitReady(ctx, timeout); err != nil {
		return fail(fmt.Errorf("promcheck: %w; log: %s", err, s.logTail()))
	}
	return s, nil
}

// freeLoopback returns a loopback address with a port free a moment ago.
func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("promcheck: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/-/ready", nil)
		if res, err := s.http.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("prometheus exited before it was ready (%v)", s.waitErr)
		case <-deadline:
			return fmt.Errorf("prometheus not ready at %s after %s", s.url, timeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTail returns the error lines of Prometheus's log, or its last lines
// when it logged no error.
func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "prometheus.log"))
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var errs []string
	for _, l := range lines {
		if strings.Contains(l, "level=error") {
			errs = append(errs, l)
		}
	}
	if len(errs) == 0 {
		errs = lines
	}
	return strings.Join(errs[max(0, len(errs)-5):], "\n")
}

// URL is the base URL of Prometheus's web UI and HTTP API.
func (s *Server) URL() string { return s.url }

// Dir is the directory of the mapped config, the TSDB and the log.
func (s *Server) Dir() string { return s.dir }

// Stop stops Prometheus (SIGTERM, then SIGKILL after 5s), waits for it to
// exit, and removes Dir if Start created it. It is safe to call twice.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		select {
		case <-s.exited:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(5 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.exited
			}
		}
	}
	if s.log != nil {
		_ = s.log.Close()
		s.log = nil
	}
	if s.tempDir {
		_ = os.RemoveAll(s.dir)
		s.tempDir = false
	}
}

// Sample is one element of a query's result: its labels and value.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

func (s *Server) get(ctx context.Context, path string, q url.Values) (json.RawMessage, error) {
	u := s.url + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	res, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	var r apiResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %d %.200s", path, res.StatusCode, b)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// Query evaluates expr at the current time (an instant query). It returns
// the result's samples (one for a scalar), or an error when the expression
// does not parse or fails, quoting Prometheus's message.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	data, err := s.get(ctx, "/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, fmt.Errorf("promcheck: query %q: %w", expr, err)
	}
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("promcheck: query %q: %w", expr, err)
	}
	type vectorSample struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	var raw []vectorSample
	switch d.ResultType {
	case "vector":
		err = json.Unmarshal(d.Result, &raw)
	case "scalar":
		var v [2]any
		err = json.Unmarshal(d.Result, &v)
		raw = []vectorSample{{Metric: map[string]string{}, Value: v}}
	default:
		return nil, fmt.Errorf("promcheck: query %q: result type %s, want an instant vector or a scalar", expr, d.ResultType)
	}
	if err != nil {
		return nil, fmt.Errorf("promcheck: query %q: %w", expr, err)
	}
	out := make([]Sample, len(raw))
	for i, r := range raw {
		str, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("promcheck: query %q: value %v: %w", expr, r.Value[1], err)
		}
		out[i] = Sample{Metric: r.Metric, Value: v}
	}
	return out, nil
}

// Alert is an alert Prometheus is evaluating, pending or firing.
type Alert struct {
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	// State is "pending" (its condition holds, not yet for its `for`) or
	// "firing".
	State    string
	ActiveAt time.Time
}

// Alerts returns the alerts that are pending or firing now, or an error
// when Prometheus cannot be asked.
func (s *Server) Alerts(ctx context.Context) ([]Alert, error) {
	data, err := s.get(ctx, "/api/v1/alerts", nil)
	if err != nil {
		return nil, fmt.Errorf("promcheck: alerts: %w", err)
	}
	var d struct {
		Alerts []struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
			State       string            `json:"state"`
			ActiveAt    time.Time         `json:"activeAt"`
		} `json:"alerts"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("promcheck: alerts: %w", err)
	}
	out := make([]Alert, len(d.Alerts))
	for i, a := range d.Alerts {
		out[i] = Alert{Name: a.Labels["alertname"], Labels: a.Labels, Annotations: a.Annotations, State: a.State, ActiveAt: a.ActiveAt}
	}
	return out, nil
}

// Exemplar is an exemplar Prometheus keeps for a series: the exemplar's
// own labels (a trace_id) and its value.
type Exemplar struct {
	Series map[string]string
	Labels map[string]string
	Value  float64
}

// Exemplars returns the exemplars Prometheus keeps, over the last window,
// for the series expr selects (its /api/v1/query_exemplars). It returns an
// error when the expression does not parse or the query fails, quoting
// Prometheus's message.
func (s *Server) Exemplars(ctx context.Context, expr string, window time.Duration) ([]Exemplar, error) {
	now := time.Now()
	data, err := s.get(ctx, "/api/v1/query_exemplars", url.Values{"query": {expr},
		"start": {strconv.FormatInt(now.Add(-window).Unix(), 10)}, "end": {strconv.FormatInt(now.Unix(), 10)}})
	if err != nil {
		return nil, fmt.Errorf("promcheck: exemplars of %q: %w", expr, err)
	}
	var d []struct {
		SeriesLabels map[string]string `json:"seriesLabels"`
		Exemplars    []struct {
			Labels map[string]string `json:"labels"`
			Value  string            `json:"value"`
		} `json:"exemplars"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("promcheck: exemplars of %q: %w", expr, err)
	}
	var out []Exemplar
	for _, series := range d {
		for _, e := range series.Exemplars {
			v, err := strconv.ParseFloat(e.Value, 64)
			if err != nil {
				return nil, fmt.Errorf("promcheck: exemplars of %q: value %q: %w", expr, e.Value, err)
			}
			out = append(out, Exemplar{Series: series.SeriesLabels, Labels: e.Labels, Value: v})
		}
	}
	return out, nil
}
