// Package dashboard serves the demo's live page: per-region throughput,
// duplicates caught per layer, redeliveries, transfers in transit, the
// invariant status and the recent traces that involved a retry or a
// duplicate, each openable as a span tree across regions. It needs no
// Grafana: the page is plain HTML, CSS and SVG drawn by a small script,
// embedded in the binary.
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// RegionSample is a region's counters at one instant. The counters are
// cumulative; InTransit is a gauge.
type RegionSample struct {
	Applied      int64            `json:"applied"`
	Deliveries   int64            `json:"deliveries"`
	Redeliveries int64            `json:"redeliveries"`
	DeadLetters  int64            `json:"dead_letters"`
	InTransit    int64            `json:"in_transit"`
	Duplicates   map[string]int64 `json:"duplicates"` // by dedup layer
}

// Source is what the page watches: regions whose counters it samples and
// whose invariants it checks.
type Source interface {
	Regions() []string
	Sample(ctx context.Context) (map[string]RegionSample, error)
	Verify(ctx context.Context) (postgres.Report, error)
}

// Progress is the run's progress, as the demo reports it.
type Progress struct {
	Sent   int64    `json:"sent"`
	Total  int64    `json:"total"`
	Faults []string `json:"faults"` // scheduled
	Fired  []string `json:"fired"`
	Phase  string   `json:"phase"`
}

// Config configures a dashboard.
type Config struct {
	Source   Source
	Recorder *Recorder       // traces; nil shows none
	Progress func() Progress // nil shows none
	Interval time.Duration   // between samples (default 1 s)
	Verify   time.Duration   // between invariant checks (default 5 s)
	Keep     int             // samples kept (default 600)
	// Alerts is the history /api/alerts serves (nil: alerts off, the
	// page says so). Its owner runs it.
	Alerts *AlertHistory
	// Webhooks, if set, reads the webhook receiver's counts (nil: the
	// page shows no webhooks).
	Webhooks func() WebhookSample
}

// WebhookSample is the webhook receiver's cumulative counts: deliveries
// received (applied, parked or duplicates) and duplicates among them.
type WebhookSample struct {
	Received   int64 `json:"received"`
	Duplicates int64 `json:"duplicates"`
}

// WebhookRates are the receiver's rates between two samples.
type WebhookRates struct {
	Received   float64 `json:"received_per_s"`
	Duplicates float64 `json:"duplicates_per_s"`
}

// Point is one sample: per region, rates per second since the previous
// sample and the gauges.
type Point struct {
	At      time.Time              `json:"at"`
	Regions map[string]RegionRates `json:"regions"`
	Layers  map[string]float64     `json:"duplicates_per_s"` // all regions, by layer
	// Webhooks is the receiver's rates (with Config.Webhooks).
	Webhooks *WebhookRates `json:"webhooks,omitempty"`
}

// RegionRates are a region's rates between two samples.
type RegionRates struct {
	Applied      float64 `json:"applied_per_s"`
	Deliveries   float64 `json:"deliveries_per_s"`
	Redeliveries float64 `json:"redeliveries_per_s"`
	InTransit    int64   `json:"in_transit"`
}

// Invariants is an invariant check: the live one checks each region in
// one snapshot of its database; the final one also checks across regions,
// once nothing is in flight.
type Invariants struct {
	CheckedAt time.Time `json:"checked_at"`
	OK        bool      `json:"ok"`
	Error     string    `json:"error,omitempty"`
	Checks    []Check   `json:"checks"`
}

// Check is one invariant's verdict.
type Check struct {
	Name     string   `json:"name"`
	OK       bool     `json:"ok"`
	Checked  int64    `json:"checked"`
	Failures []string `json:"failures,omitempty"`
}

// Stats is what /api/stats returns. Its lists are never null in JSON.
type Stats struct {
	Regions    []string                `json:"regions"`
	Layers     []string                `json:"layers"`
	Points     []Point                 `json:"points"`
	Totals     map[string]RegionSample `json:"totals"`
	Progress   *Progress               `json:"progress,omitempty"`
	Webhooks   *WebhookSample          `json:"webhooks,omitempty"`
	Invariants *Invariants             `json:"invariants,omitempty"`
	Final      *Invariants             `json:"final,omitempty"`
}

// Dashboard samples a Source and serves the page.
type Dashboard struct {
	cfg      Config
	mu       sync.Mutex
	points   []Point
	last     map[string]RegionSample
	lastHook *WebhookSample
	lastAt   time.Time
	inv      *Invariants
	final    *Invariants
}

// New returns a dashboard; Run starts its sampling.
func New(cfg Config) *Dashboard {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Verify <= 0 {
		cfg.Verify = 5 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 600
	}
	if cfg.Alerts == nil {
		cfg.Alerts = AlertsOff("no Prometheus evaluates the alert rules")
	}
	return &Dashboard{cfg: cfg}
}

// Run samples the source and checks the invariants until ctx ends.
func (d *Dashboard) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { d.every(ctx, d.cfg.Interval, d.sample) })
	wg.Go(func() { d.every(ctx, d.cfg.Verify, d.verify) })
	wg.Wait()
}

func (d *Dashboard) every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample reads the counters once and appends the rates since the last
// sample.
func (d *Dashboard) sample(ctx context.Context) {
	cur, err := d.cfg.Source.Sample(ctx)
	if err != nil {
		return // a region restarting: the next sample catches up
	}
	var hook *WebhookSample
	if d.cfg.Webhooks != nil {
		h := d.cfg.Webhooks()
		hook = &h
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last != nil {
		dt := now.Sub(d.lastAt).Seconds()
		p := Point{At: now, Regions: map[string]RegionRates{}, Layers: map[string]float64{}}
		for name, c := range cur {
			prev := d.last[name]
			p.Regions[name] = RegionRates{
				Applied:      rate(c.Applied, prev.Applied, dt),
				Deliveries:   rate(c.Deliveries, prev.Deliveries, dt),
				Redeliveries: rate(c.Redeliveries, prev.Redeliveries, dt),
				InTransit:    c.InTransit,
			}
			for layer, n := range c.Duplicates {
				p.Layers[layer] += rate(n, prev.Duplicates[layer], dt)
			}
		}
		if hook != nil && d.lastHook != nil {
			p.Webhooks = &WebhookRates{Received: rate(hook.Received, d.lastHook.Received, dt), Duplicates: rate(hook.Duplicates, d.lastHook.Duplicates, dt)}
		}
		d.points = append(d.points, p)
		if len(d.points) > d.cfg.Keep {
			d.points = d.points[len(d.points)-d.cfg.Keep:]
		}
	}
	d.last, d.lastHook, d.lastAt = cur, hook, now
}

// rate is the counter's increase per second; a counter that went back (a
// region restarted) counts from zero.
func rate(cur, prev int64, dt float64) float64 {
	if dt <= 0 {
		return 0
	}
	if cur < prev {
		prev = 0
	}
	return float64(cur-prev) / dt
}

func (d *Dashboard) verify(ctx context.Context) {
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rep, err := d.cfg.Source.Verify(vctx)
	if ctx.Err() != nil {
		return
	}
	inv := invariants(rep, err)
	d.mu.Lock()
	d.inv = inv
	d.mu.Unlock()
}

func invariants(rep postgres.Report, err error) *Invariants {
	inv := &Invariants{CheckedAt: time.Now(), OK: err == nil && rep.OK()}
	if err != nil {
		inv.Error = err.Error()
	}
	for _, c := range rep.Checks {
		inv.Checks = append(inv.Checks, Check(c))
	}
	return inv
}

// SetFinal shows the final report, across regions, once a run is over.
func (d *Dashboard) SetFinal(rep postgres.Report, err error) {
	inv := invariants(rep, err)
	d.mu.Lock()
	d.final = inv
	d.mu.Unlock()
}

// Stats returns the samples so far.
func (d *Dashboard) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	// The lists are [] before the first sample, never null: the page maps
	// over them.
	st := Stats{Regions: append([]string{}, d.cfg.Source.Regions()...), Layers: []string{}, Points: append([]Point{}, d.points...),
		Totals: d.last, Webhooks: d.lastHook, Invariants: d.inv, Final: d.final}
	seen := map[string]bool{}
	for _, s := range d.last {
		for l := range s.Duplicates {
			if !seen[l] {
				seen[l] = true
				st.Layers = append(st.Layers, l)
			}
		}
	}
	slices.Sort(st.Layers)
	if d.cfg.Progress != nil {
		p := d.cfg.Progress()
		st.Progress = &p
	}
	return st
}

//go:embed static
var static embed.FS

// Handler serves the page and its JSON:
//
//	GET /                   the page
//	GET /api/stats          samples, totals, progress and invariants
//	GET /api/alerts         alerts active now, and those fired and cleared
//	GET /api/traces         traces with a retry or a duplicate, newest first
//	GET /api/traces/{id}    one trace's spans (32 hex digits)
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	files, _ := fs.Sub(static, "static")
	mux.Handle("GET /", http.FileServerFS(files))
	mux.HandleFunc("GET /api/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, d.Stats()) })
	mux.HandleFunc("GET /api/alerts", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, d.cfg.Alerts.Snapshot()) })
	mux.HandleFunc("GET /api/traces", func(w http.ResponseWriter, _ *http.Request) {
		list := []TraceSummary{}
		if d.cfg.Recorder != nil {
			list = append(list, d.cfg.Recorder.Traces()...)
		}
		writeJSON(w, http.StatusOK, list)
	})
	mux.HandleFunc("GET /api/traces/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := trace.TraceIDFromHex(r.PathValue("id"))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "a trace id is 32 lowercase hex digits, not all zero"})
			return
		}
		var t Trace
		ok := false
		if d.cfg.Recorder != nil {
			t, ok = d.cfg.Recorder.Trace(id)
		}
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such trace is kept (only recent ones are)"})
			return
		}
		writeJSON(w, http.StatusOK, t)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Serve listens on addr and serves the page until ctx ends. It returns the
// page's URL once it listens.
func (d *Dashboard) Serve(ctx context.Context, addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = hs.Close()
	}()
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = ln.Close()
		}
	}()
	return "http://" + ln.Addr().String() + "/", nil
}
