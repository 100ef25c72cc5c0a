package dupexplain

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Print writes the report: the region's duplicates and their share of its
// deliveries, the causes most first (count, share, ages, layers), and the
// traces to open (with their Jaeger link when jaeger is set).
func (r Report) Print(w io.Writer, jaeger string) {
	share := math.NaN()
	if r.Deliveries > 0 {
		share = 100 * r.Duplicates / r.Deliveries
	}
	fmt.Fprintf(w, "duplicates in %s over the last %v: %.0f, %s of %.0f deliveries\n", r.Region, r.Since, r.Duplicates, percent(share), r.Deliveries)
	if len(r.Causes) == 0 {
		fmt.Fprintln(w, "no duplicate was caught")
	} else {
		fmt.Fprintf(w, "%-14s %8s %7s %10s %10s %10s  %s\n", "cause", "count", "share", "age p50", "age p99", "age p99.9", "caught by")
	}
	for _, c := range r.Causes {
		fmt.Fprintf(w, "%-14s %8.0f %7s %10s %10s %10s  %s\n", c.Cause, c.Count, percent(100*c.Count/r.Duplicates), age(c.AgeP50), age(c.AgeP99), age(c.AgeP999), layers(c.Layers))
	}
	fmt.Fprintf(w, "traces of recent duplicates (%s):\n", r.TraceSource)
	for _, t := range r.Traces {
		link := ""
		if jaeger != "" {
			link = "  " + strings.TrimSuffix(jaeger, "/") + "/trace/" + t.ID
		}
		fmt.Fprintf(w, "  %s  %-12s %-14s %-7s %s%s\n", t.ID, t.Cause, t.Layer, t.Service, t.At.UTC().Format(time.TimeOnly), link)
	}
}

func percent(p float64) string {
	if math.IsNaN(p) || math.IsInf(p, 0) {
		return "-"
	}
	return fmt.Sprintf("%.1f %%", p)
}

// age renders a duration in seconds, as a histogram's quantile gives it.
func age(s float64) string {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return "-"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

// layers renders the counts by layer, most first.
func layers(m map[string]float64) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("%s %.0f", k, m[k])
	}
	return strings.Join(parts, ", ")
}
