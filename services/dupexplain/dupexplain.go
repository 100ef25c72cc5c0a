// Package dupexplain explains a region's recent duplicates from what the
// region exports: the counts, causes, layers and ages from Prometheus (the
// duplicate counters by cause and layer, and the
// paymesh_duplicate_age_seconds histogram every service records each
// duplicate in), and a few trace IDs of duplicates from the histogram's
// exemplars, or from Jaeger's trace search. It reads no database: an
// operator runs it with the observability stack alone (paymesh dup
// explain).
package dupexplain

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config says where to read and what to explain.
type Config struct {
	// Prometheus is the base URL of the Prometheus that scrapes the
	// region's services (required).
	Prometheus string
	// Jaeger, if set, is the base URL of Jaeger's query service: traces
	// of duplicates are searched there when Prometheus holds no exemplars.
	Jaeger string
	// Region and Since: the region's duplicates of the last Since.
	Region string
	Since  time.Duration
	// Traces is how many trace IDs to list at most (default 5).
	Traces int
	// HTTP is the client (default: one with a 10 s timeout).
	HTTP *http.Client
}

// Cause is one cause's share of the duplicates.
type Cause struct {
	Cause string
	Count float64
	// AgeP50, AgeP99 and AgeP999 are the duplicates' ages (since their
	// key's first effect), from the histogram's buckets; NaN when none.
	// AgeP999 is what PaymeshDedupWindowNear holds against the window.
	AgeP50, AgeP99, AgeP999 float64
	// Layers is the count by the layer that caught them.
	Layers map[string]float64
}

// Trace is a duplicate whose trace can be opened.
type Trace struct {
	ID           string
	Cause, Layer string
	Service      string
	At           time.Time
}

// Report is what Explain found.
type Report struct {
	Region     string
	Since      time.Duration
	Duplicates float64
	Deliveries float64 // the ledger's deliveries and the routers' publishes acked
	Causes     []Cause // most first
	Traces     []Trace // newest first
	// TraceSource names where the traces came from (exemplars, jaeger),
	// or why there are none.
	TraceSource string
}

// Errors returned by Explain.
var (
	// ErrConfig is returned for a configuration that names no Prometheus,
	// no region, or no positive window.
	ErrConfig = errors.New("dupexplain: bad configuration")
	// ErrQuery is returned when Prometheus or Jaeger cannot be read or
	// answers with an error.
	ErrQuery = errors.New("dupexplain: query failed")
)

// Explain reads the region's duplicates of the last cfg.Since. It returns
// ErrConfig for a bad configuration and ErrQuery when Prometheus (or
// Jaeger, when it is asked) cannot be read.
func Explain(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Prometheus == "" || cfg.Region == "" || cfg.Since <= 0 {
		return Report{}, fmt.Errorf("%w: want a Prometheus URL, a region and a positive window (got %q, %q, %v)", ErrConfig, cfg.Prometheus, cfg.Region, cfg.Since)
	}
	if strings.ContainsAny(cfg.Region, `"\{}`) {
		return Report{}, fmt.Errorf("%w: region %q", ErrConfig, cfg.Region)
	}
	if cfg.Traces <= 0 {
		cfg.Traces = 5
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	p := prom{cfg: cfg, now: time.Now()}
	rep := Report{Region: cfg.Region, Since: cfg.Since}
	var err error
	if rep.Causes, rep.Duplicates, err = p.causes(ctx); err != nil {
		return Report{}, err
	}
	if rep.Deliveries, err = p.deliveries(ctx); err != nil {
		return Report{}, err
	}
	if rep.Traces, err = p.exemplars(ctx); err != nil {
		return Report{}, err
	}
	rep.TraceSource = "exemplars of paymesh_duplicate_age_seconds in Prometheus"
	if len(rep.Traces) == 0 && cfg.Jaeger != "" {
		if rep.Traces, err = searchJaeger(ctx, cfg, p.now); err != nil {
			return Report{}, err
		}
		rep.TraceSource = "Jaeger's search for spans tagged paymesh.dedup.outcome=duplicate"
	}
	if len(rep.Traces) == 0 {
		rep.TraceSource = "none: Prometheus kept no exemplar (it needs --enable-feature=exemplar-storage and sampled spans)"
		if cfg.Jaeger != "" {
			rep.TraceSource += ", and Jaeger found no duplicate's span"
		}
	}
	return rep, nil
}

// prom queries Prometheus's HTTP API at one instant.
type prom struct {
	cfg Config
	now time.Time
}

// window is the PromQL offset of the report: the last Since, in seconds.
func (p prom) window() string { return strconv.FormatInt(int64(p.cfg.Since.Seconds()), 10) + "s" }

// growth returns the PromQL of how much each series of the counter m (a
// selector) grew over the window: its value now less its value at the
// window's start, or its whole value when it began within the window (or
// its process restarted), so that a series' first counts are not lost
// (increase() misses those of a series that appears with them, as a
// histogram's does with its first duplicate).
func (p prom) growth(m string) string {
	return `((` + m + ` - ` + m + ` offset ` + p.window() + `) >= 0 or ` + m + `)`
}

// causes returns the duplicates by cause, with their layers and ages, and
// their sum.
func (p prom) causes(ctx context.Context) ([]Cause, float64, error) {
	r := `region="` + p.cfg.Region + `"`
	var counts []sample
	for _, m := range []string{`paymesh_duplicates_total{` + r + `}`, `paymesh_router_duplicates_total{` + r + `}`,
		`paymesh_idempotency_keys_total{` + r + `,outcome="replay"}`} {
		v, err := p.vector(ctx, `sum by (cause, layer) (`+p.growth(m)+`)`)
		if err != nil {
			return nil, 0, err
		}
		counts = append(counts, v...)
	}
	by := map[string]*Cause{}
	var total float64
	for _, s := range counts {
		if s.value <= 0 {
			continue
		}
		c := by[s.labels["cause"]]
		if c == nil {
			c = &Cause{Cause: s.labels["cause"], Layers: map[string]float64{}, AgeP50: math.NaN(), AgeP99: math.NaN(), AgeP999: math.NaN()}
			by[c.Cause] = c
		}
		c.Count += s.value
		c.Layers[s.labels["layer"]] += s.value
		total += s.value
	}
	if err := p.ages(ctx, by); err != nil {
		return nil, 0, err
	}
	var out []Cause
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Cause) int { return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Cause, b.Cause)) })
	return out, total, nil
}

// ages fills in each cause's age quantiles, from the histogram's buckets'
// growth over the window.
func (p prom) ages(ctx context.Context, by map[string]*Cause) error {
	buckets := p.growth(`paymesh_duplicate_age_seconds_bucket{region="` + p.cfg.Region + `"}`)
	for _, q := range []struct {
		phi float64
		set func(*Cause, float64)
	}{{0.5, func(c *Cause, v float64) { c.AgeP50 = v }}, {0.99, func(c *Cause, v float64) { c.AgeP99 = v }},
		{0.999, func(c *Cause, v float64) { c.AgeP999 = v }}} {
		ages, err := p.vector(ctx, fmt.Sprintf(`histogram_quantile(%g, sum by (cause, le) (%s))`, q.phi, buckets))
		if err != nil {
			return err
		}
		for _, s := range ages {
			if c := by[s.labels["cause"]]; c != nil {
				q.set(c, s.value)
			}
		}
	}
	return nil
}

// deliveries returns what the duplicates are a share of: the ledger's
// deliveries and the acked publishes of the region's routers and of its
// ledger (the saga steps it sends).
func (p prom) deliveries(ctx context.Context) (float64, error) {
	r := `{region="` + p.cfg.Region + `"}`
	var sum float64
	for _, m := range []string{"paymesh_deliveries_total", "paymesh_router_submitted_total", "paymesh_router_forwarded_total", "paymesh_router_relayed_total",
		"paymesh_saga_steps_sent_total"} {
		v, err := p.vector(ctx, `sum(`+p.growth(m+r)+`)`)
		if err != nil {
			return 0, err
		}
		for _, s := range v {
			sum += s.value
		}
	}
	return sum, nil
}

// unixSeconds renders t as Prometheus's API takes a time: Unix seconds,
// to the millisecond (whole seconds would read up to a second earlier,
// before the latest scrape).
func unixSeconds(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

// sample is one series of an instant vector.
type sample struct {
	labels map[string]string
	value  float64
}

// vector runs an instant query.
func (p prom) vector(ctx context.Context, query string) ([]sample, error) {
	var res struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	q := url.Values{"query": {query}, "time": {unixSeconds(p.now)}}
	if err := p.get(ctx, "/api/v1/query?"+q.Encode(), &res); err != nil {
		return nil, err
	}
	out := make([]sample, 0, len(res.Result))
	for _, r := range res.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: value %v", ErrQuery, query, r.Value[1])
		}
		out = append(out, sample{labels: r.Metric, value: v})
	}
	return out, nil
}

// exemplars returns the newest duplicates whose traces the histogram's
// exemplars name.
func (p prom) exemplars(ctx context.Context) ([]Trace, error) {
	var res []struct {
		SeriesLabels map[string]string `json:"seriesLabels"`
		Exemplars    []struct {
			Labels    map[string]string `json:"labels"`
			Timestamp float64           `json:"timestamp"`
		} `json:"exemplars"`
	}
	q := url.Values{"query": {`paymesh_duplicate_age_seconds_bucket{region="` + p.cfg.Region + `"}`},
		"start": {unixSeconds(p.now.Add(-p.cfg.Since))}, "end": {unixSeconds(p.now)}}
	if err := p.get(ctx, "/api/v1/query_exemplars?"+q.Encode(), &res); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []Trace
	for _, s := range res {
		for _, e := range s.Exemplars {
			id := e.Labels["trace_id"]
			if id == "" || seen[id] {
				continue
			}
			seen[id] = true
			sec, frac := int64(e.Timestamp), e.Timestamp-float64(int64(e.Timestamp))
			out = append(out, Trace{ID: id, Cause: s.SeriesLabels["cause"], Layer: s.SeriesLabels["layer"], Service: s.SeriesLabels["service"],
				At: time.Unix(sec, int64(frac*1e9))})
		}
	}
	slices.SortFunc(out, func(a, b Trace) int { return cmp.Or(b.At.Compare(a.At), cmp.Compare(a.ID, b.ID)) })
	return out[:min(len(out), p.cfg.Traces)], nil
}

// get reads one Prometheus API answer's data into v.
func (p prom) get(ctx context.Context, path string, v any) error {
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := getJSON(ctx, p.cfg.HTTP, strings.TrimSuffix(p.cfg.Prometheus, "/")+path, &env); err != nil {
		return err
	}
	if env.Status != "success" {
		return fmt.Errorf("%w: prometheus %s: %s", ErrQuery, path, env.Error)
	}
	if err := json.Unmarshal(env.Data, v); err != nil {
		return fmt.Errorf("%w: prometheus %s: %v", ErrQuery, path, err)
	}
	return nil
}

// getJSON decodes the JSON answer to GET u into v.
func getJSON(ctx context.Context, c *http.Client, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrQuery, err)
	}
	res, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrQuery, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrQuery, u, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %s: %d %.200s", ErrQuery, u, res.StatusCode, body)
	}
	return nil
}
