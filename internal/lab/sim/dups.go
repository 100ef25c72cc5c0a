package sim

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/paymesh/paymesh/services/dupexplain"
)

// Explained is why the run's duplicates came, as an operator reads it
// (paymesh dup explain on the simulation's Prometheus): per region the
// duplicates by cause, with their ages and layers, and the windows the
// layers catch them within; for the degraded link, the cause that
// dominated while it was degraded and a trace of one of its duplicates.
type Explained struct {
	// Regions is each region's duplicates over the load.
	Regions map[string]dupexplain.Report
	// Windows is each region's dedup windows in force, by layer, in
	// seconds (paymesh_dedup_window_seconds).
	Windows map[string]map[string]float64
	// Degraded is us's duplicates since its link was degraded (nil: the
	// degrade fault did not run).
	Degraded *dupexplain.Report `json:",omitempty"`
	// Traced says whether the services export traces (a trace backend
	// runs): without one no exemplar or span names a duplicate.
	Traced bool
	// InJaeger is the degraded link's first duplicate trace as Jaeger
	// holds it (nil: not looked up, or not found: see JaegerError).
	InJaeger    *TraceFound `json:",omitempty"`
	JaegerError string      `json:",omitempty"`
	// Error is why the duplicates could not be read.
	Error string `json:",omitempty"`
}

// explainDuplicates reads, from the simulation's Prometheus, each region's
// duplicates since the load began and the windows in force, and us's
// since its link was degraded.
func (s *sim) explainDuplicates(ctx context.Context, rep *Report, since time.Time) {
	e := &Explained{Regions: map[string]dupexplain.Report{}, Windows: map[string]map[string]float64{}, Traced: s.traced()}
	rep.Explained = e
	for _, r := range s.regions() {
		d, err := dupexplain.Explain(ctx, dupexplain.Config{Prometheus: s.prom.URL(), Region: r, Since: time.Since(since), Traces: 3})
		if err != nil {
			e.Error = err.Error()
			return
		}
		e.Regions[r] = d
	}
	res, err := s.prom.Query(ctx, `max by (region, layer) (paymesh_dedup_window_seconds)`)
	if err != nil {
		e.Error = err.Error()
		return
	}
	for _, v := range res {
		if e.Windows[v.Metric["region"]] == nil {
			e.Windows[v.Metric["region"]] = map[string]float64{}
		}
		e.Windows[v.Metric["region"]][v.Metric["layer"]] = v.Value
	}
	if !rep.DegradedFrom.IsZero() {
		d, err := dupexplain.Explain(ctx, dupexplain.Config{Prometheus: s.prom.URL(), Jaeger: s.jaegerURL(), Region: "us", Since: time.Since(rep.DegradedFrom), Traces: 3})
		if err != nil {
			e.Error = err.Error()
			return
		}
		e.Degraded = &d
		if e.Traced {
			e.lookUp(ctx, s.jaegerURL())
		}
	}
}

// lookUp reads the degraded link's first duplicate trace from Jaeger.
func (e *Explained) lookUp(ctx context.Context, jaeger string) {
	if len(e.Degraded.Traces) == 0 {
		e.JaegerError = "no trace to look up: " + e.Degraded.TraceSource
		return
	}
	t, err := findTrace(ctx, jaeger, e.Degraded.Traces[0].ID)
	if err != nil {
		e.JaegerError = err.Error()
		return
	}
	e.InJaeger = &t
}

// jaegerCheck is the report's check that Jaeger holds the trace it names.
func (e *Explained) jaegerCheck() (ok bool, name, detail string) {
	if t := e.InJaeger; t != nil {
		return true, fmt.Sprintf("Jaeger holds the trace of a duplicate on the degraded link (%s: %d spans from %s)", t.ID, t.Spans, strings.Join(t.Services, ", ")), ""
	}
	return false, "Jaeger holds the trace of a duplicate on the degraded link", e.JaegerError
}

// traced reports whether the simulation runs a trace backend, which its
// services export their spans to (and sample them: the duplicates' ages
// keep exemplars).
func (s *sim) traced() bool { return s.jaegerService() != "" }

// regions returns the simulation's region names, sorted.
func (s *sim) regions() []string {
	var out []string
	for _, r := range s.table.Regions {
		out = append(out, r.Name)
	}
	slices.Sort(out)
	return out
}

// print writes the duplicates by region and cause, their ages against the
// windows, and what dominated on the degraded link.
func (e *Explained) print(w io.Writer) {
	if e.Error != "" {
		fmt.Fprintf(w, "why duplicates came: not read (%s)\n", e.Error)
		return
	}
	fmt.Fprintln(w, "why duplicates came, by region and cause (count, age p50 / p99 / p99.9 since the key's first effect, caught by):")
	for _, r := range slices.Sorted(maps.Keys(e.Regions)) {
		d := e.Regions[r]
		fmt.Fprintf(w, "  %s: %.0f duplicates; windows %s\n", r, d.Duplicates, windows(e.Windows[r]))
		for _, c := range d.Causes {
			fmt.Fprintf(w, "    %-13s %6.0f  %9s / %9s / %9s  %s\n", c.Cause, c.Count, ageOf(c.AgeP50), ageOf(c.AgeP99), ageOf(c.AgeP999), byLayer(c.Layers))
		}
	}
	if d := e.Degraded; d != nil {
		fmt.Fprintf(w, "us since its link was degraded: %s\n", e.dominant())
		for _, t := range d.Traces {
			fmt.Fprintf(w, "  trace %s: a %s duplicate caught by %s in %s\n", t.ID, t.Cause, t.Layer, t.Service)
		}
		if t := e.InJaeger; t != nil {
			fmt.Fprintf(w, "  in Jaeger: trace %s, %d spans from %s\n", t.ID, t.Spans, strings.Join(t.Services, ", "))
		}
		if len(d.Traces) == 0 {
			fmt.Fprintf(w, "  no trace: %s\n", d.TraceSource)
		}
	}
}

// dominant names the cause of most of the degraded link's duplicates.
func (e *Explained) dominant() string {
	d := e.Degraded
	if d == nil || len(d.Causes) == 0 {
		return "no duplicates"
	}
	c := d.Causes[0]
	return fmt.Sprintf("%.0f duplicates, %.0f %% of them %s (age p99 %s)", d.Duplicates, 100*c.Count/d.Duplicates, c.Cause, ageOf(c.AgeP99))
}

// check is the report's check of the degraded link: the cause that
// dominated is named, and, when the services export traces, a trace of a
// duplicate on it.
func (e *Explained) check() (ok bool, name, detail string) {
	switch {
	case e.Error != "":
		return false, "why the degraded link's duplicates came (paymesh dup explain)", e.Error
	case e.Degraded == nil || len(e.Degraded.Causes) == 0:
		return false, "why the degraded link's duplicates came: us had none since its link was degraded", ""
	case e.Traced && len(e.Degraded.Traces) == 0:
		return false, "a trace of a duplicate on the degraded link: " + e.dominant(), e.Degraded.TraceSource
	case !e.Traced:
		return true, "why the degraded link's duplicates came: " + e.dominant() + " (no trace: the services export none without a trace backend)", ""
	}
	return true, fmt.Sprintf("why the degraded link's duplicates came: %s; trace %s", e.dominant(), e.Degraded.Traces[0].ID), ""
}

func windows(m map[string]float64) string {
	if len(m) == 0 {
		return "unknown"
	}
	var parts []string
	for _, l := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, l+" "+time.Duration(m[l]*float64(time.Second)).String())
	}
	return strings.Join(parts, ", ")
}

func byLayer(m map[string]float64) string {
	var parts []string
	for _, l := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", l, m[l]))
	}
	return strings.Join(parts, ", ")
}

func ageOf(s float64) string {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return "-"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}
