// Package scrape reads a service's /metrics in tests: the samples of one
// metric, in the Prometheus text format, with their labels.
package scrape

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
)

// Sample is one sample of a scraped metric.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// matches reports whether s has every label of want, with its value.
func (s Sample) matches(want map[string]string) bool {
	for k, v := range want {
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}

// Text returns the body served at url (a /metrics page). It fails the
// test when url cannot be read.
func Text(tb testing.TB, url string) string {
	tb.Helper()
	res, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

var label = regexp.MustCompile(`(\w+)="([^"]*)"`)

// Samples returns every sample of metric name at url (the metric's series
// with labels; a series without labels is not one). It fails the test when
// url cannot be read.
func Samples(tb testing.TB, url, name string) []Sample {
	tb.Helper()
	b := Text(tb, url)
	line := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{([^}]*)\} (\S+)$`)
	var out []Sample
	for _, m := range line.FindAllStringSubmatch(b, -1) {
		s := Sample{Labels: map[string]string{}}
		for _, l := range label.FindAllStringSubmatch(m[1], -1) {
			s.Labels[l[1]] = l[2]
		}
		s.Value, _ = strconv.ParseFloat(m[2], 64)
		out = append(out, s)
	}
	return out
}

// Sum returns the sum of the samples of name at url whose labels include
// every pair of labels.
func Sum(tb testing.TB, url, name string, labels map[string]string) int64 {
	tb.Helper()
	var sum int64
	for _, s := range Samples(tb, url, name) {
		if s.matches(labels) {
			sum += int64(s.Value)
		}
	}
	return sum
}

// One returns the value of the one sample of name at url whose labels
// include every pair of labels, and whether there is one. It fails the test
// when there are several.
func One(tb testing.TB, url, name string, labels map[string]string) (float64, bool) {
	tb.Helper()
	var found []Sample
	for _, s := range Samples(tb, url, name) {
		if s.matches(labels) {
			found = append(found, s)
		}
	}
	switch len(found) {
	case 0:
		return 0, false
	case 1:
		return found[0].Value, true
	}
	tb.Fatalf("%s%v: %d samples, want one", name, labels, len(found))
	return 0, false
}
