package dupexplain

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// searchJaeger returns the newest traces, in every service Jaeger knows,
// with a span of the region tagged as a caught duplicate
// (paymesh.dedup.outcome=duplicate), each with the span's cause and layer.
func searchJaeger(ctx context.Context, cfg Config, now time.Time) ([]Trace, error) {
	base := strings.TrimSuffix(cfg.Jaeger, "/")
	var services struct {
		Data []string `json:"data"`
	}
	if err := getJSON(ctx, cfg.HTTP, base+"/api/services", &services); err != nil {
		return nil, err
	}
	tags, _ := json.Marshal(map[string]string{"paymesh.dedup.outcome": "duplicate", "paymesh.region": cfg.Region})
	seen := map[string]bool{}
	var out []Trace
	for _, svc := range services.Data {
		q := url.Values{"service": {svc}, "tags": {string(tags)}, "limit": {strconv.Itoa(cfg.Traces)},
			"start": {strconv.FormatInt(now.Add(-cfg.Since).UnixMicro(), 10)}, "end": {strconv.FormatInt(now.UnixMicro(), 10)}}
		var res jaegerTraces
		if err := getJSON(ctx, cfg.HTTP, base+"/api/traces?"+q.Encode(), &res); err != nil {
			return nil, err
		}
		if len(res.Errors) > 0 {
			return nil, fmt.Errorf("%w: jaeger %s: %s", ErrQuery, svc, res.Errors[0].Msg)
		}
		for _, t := range res.Data {
			if tr, ok := t.duplicate(cfg.Region); ok && !seen[tr.ID] {
				seen[tr.ID] = true
				out = append(out, tr)
			}
		}
	}
	slices.SortFunc(out, func(a, b Trace) int { return cmp.Or(b.At.Compare(a.At), cmp.Compare(a.ID, b.ID)) })
	return out[:min(len(out), cfg.Traces)], nil
}

// jaegerTraces is the answer to Jaeger's trace search (its HTTP API).
type jaegerTraces struct {
	Data   []jaegerTrace `json:"data"`
	Errors []struct {
		Msg string `json:"msg"`
	} `json:"errors"`
}

// jaegerTrace is one trace of a search's answer.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		StartTime int64  `json:"startTime"` // microseconds
		ProcessID string `json:"processID"`
		Tags      []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// duplicate returns the trace's first span of region that caught a
// duplicate.
func (t jaegerTrace) duplicate(region string) (Trace, bool) {
	for _, s := range t.Spans {
		tags := map[string]string{}
		for _, kv := range s.Tags {
			tags[kv.Key] = fmt.Sprint(kv.Value)
		}
		if tags["paymesh.dedup.outcome"] == "duplicate" && tags["paymesh.region"] == region {
			return Trace{ID: t.TraceID, Cause: tags["paymesh.dedup.cause"], Layer: tags["paymesh.dedup.layer"],
				Service: t.Processes[s.ProcessID].ServiceName, At: time.UnixMicro(s.StartTime)}, true
		}
	}
	return Trace{}, false
}
