package dashboard

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Span is one recorded span, as the page shows it.
type Span struct {
	SpanID   string            `json:"span_id"`
	ParentID string            `json:"parent_id,omitempty"`
	Name     string            `json:"name"`
	Kind     string            `json:"kind"`
	Region   string            `json:"region,omitempty"`
	Start    time.Time         `json:"start"`
	Duration float64           `json:"duration_ms"`
	Attrs    map[string]string `json:"attributes"`
	Links    []Link            `json:"links,omitempty"`
	Events   []Event           `json:"events,omitempty"`
	Error    string            `json:"error,omitempty"`
}

// Link is a span link: a redelivery's or a retried forward's link to its
// first attempt.
type Link struct {
	TraceID string `json:"trace_id"`
	SpanID  string `json:"span_id"`
	Kind    string `json:"kind,omitempty"` // the link's paymesh.link attribute
}

// Event is a span event, such as a retry with its attempt number.
type Event struct {
	Name  string            `json:"name"`
	At    time.Time         `json:"at"`
	Attrs map[string]string `json:"attributes,omitempty"`
}

// TraceSummary is one line of the list of traces with a retry or a
// duplicate. Its lists are never null in JSON: the page maps over them.
type TraceSummary struct {
	TraceID string    `json:"trace_id"`
	Start   time.Time `json:"start"`
	Root    string    `json:"root"`
	Spans   int       `json:"spans"`
	Regions []string  `json:"regions"`
	Reasons []string  `json:"reasons"` // redelivery, retry, duplicate
	Layers  []string  `json:"layers"`  // dedup layers that caught a duplicate
}

// Trace is a recorded trace with its spans in start order.
type Trace struct {
	TraceSummary
	SpanList []Span `json:"span_list"`
}

// Limits of the recorder: how many recent traces it keeps to catch a late
// retry, how many traces with a retry or duplicate it keeps, and how many
// spans of one trace.
const (
	recentTraces  = 4096
	keptTraces    = 200
	spansPerTrace = 256
)

// Recorder is an OpenTelemetry span processor that keeps recent traces in
// memory and remembers the ones in which a message was delivered again, a
// publish was retried, or a duplicate was caught. It keeps the messaging
// spans (api, router, ledger deliveries) and leaves out the database
// spans, which the page does not draw.
type Recorder struct {
	mu     sync.Mutex
	traces map[trace.TraceID]*traceRec
	recent ring
	kept   ring
}

type traceRec struct {
	spans    []Span
	reasons  []string
	layers   []string
	regions  []string
	inRecent bool
	kept     bool
}

// ring is a fixed-size FIFO of trace ids.
type ring struct {
	ids  []trace.TraceID
	next int
	full bool
}

// push adds id and returns the id it evicted, if any.
func (r *ring) push(id trace.TraceID, size int) (trace.TraceID, bool) {
	if r.ids == nil {
		r.ids = make([]trace.TraceID, size)
	}
	old, evicted := r.ids[r.next], r.full
	r.ids[r.next] = id
	r.next = (r.next + 1) % size
	if r.next == 0 {
		r.full = true
	}
	return old, evicted
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{traces: map[trace.TraceID]*traceRec{}}
}

var _ sdktrace.SpanProcessor = (*Recorder)(nil)

// OnStart does nothing: spans are recorded when they end.
func (*Recorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// Shutdown does nothing.
func (*Recorder) Shutdown(context.Context) error { return nil }

// ForceFlush does nothing.
func (*Recorder) ForceFlush(context.Context) error { return nil }

// skipped reports whether s is one of the spans the page leaves out: the
// database's, and the batch transactions, the ledger's and the API's
// (traces of their own, linked to each member: each member's own span
// tells its outcome).
func skipped(s sdktrace.ReadOnlySpan) bool {
	scope := s.InstrumentationScope().Name
	return scope == "github.com/paymesh/paymesh/services/ledger/postgres" || s.Name() == "apply batch" || s.Name() == "apply batch here"
}

// OnEnd records an ended span.
func (r *Recorder) OnEnd(s sdktrace.ReadOnlySpan) {
	if skipped(s) {
		return
	}
	sp := convert(s)
	reasons, layer := why(sp)
	tid := s.SpanContext().TraceID()

	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.traces[tid]
	if !ok {
		t = &traceRec{inRecent: true}
		r.traces[tid] = t
		if old, evicted := r.recent.push(tid, recentTraces); evicted {
			if o := r.traces[old]; o != nil {
				o.inRecent = false
				r.drop(old, o)
			}
		}
	}
	if len(t.spans) < spansPerTrace {
		t.spans = append(t.spans, sp)
	}
	if sp.Region != "" && !slices.Contains(t.regions, sp.Region) {
		t.regions = append(t.regions, sp.Region)
	}
	for _, why := range reasons {
		if !slices.Contains(t.reasons, why) {
			t.reasons = append(t.reasons, why)
		}
	}
	if layer != "" && !slices.Contains(t.layers, layer) {
		t.layers = append(t.layers, layer)
	}
	if len(reasons) > 0 && !t.kept {
		t.kept = true
		if old, evicted := r.kept.push(tid, keptTraces); evicted {
			if o := r.traces[old]; o != nil {
				o.kept = false
				r.drop(old, o)
			}
		}
	}
}

// drop forgets a trace that is neither recent nor kept.
func (r *Recorder) drop(id trace.TraceID, t *traceRec) {
	if !t.inRecent && !t.kept {
		delete(r.traces, id)
	}
}

// why tells what makes a span worth a look: a delivery after the first, a
// link to a first attempt, a retry event, a duplicate caught.
func why(s Span) (reasons []string, layer string) {
	if n, err := strconv.Atoi(s.Attrs["messaging.nats.delivery_count"]); err == nil && n > 1 {
		reasons = append(reasons, "redelivery")
	}
	if len(reasons) == 0 && slices.ContainsFunc(s.Links, func(l Link) bool { return l.Kind != "batch_member" }) {
		reasons = append(reasons, "retry") // a link to an earlier attempt, not to a batch's member
	}
	for _, e := range s.Events {
		if e.Name == "retry" && !slices.Contains(reasons, "retry") {
			reasons = append(reasons, "retry")
		}
	}
	if s.Attrs["paymesh.dedup.outcome"] == "duplicate" {
		reasons = append(reasons, "duplicate")
		layer = s.Attrs["paymesh.dedup.layer"]
	}
	return reasons, layer
}

func convert(s sdktrace.ReadOnlySpan) Span {
	sp := Span{
		SpanID:   s.SpanContext().SpanID().String(),
		Name:     s.Name(),
		Kind:     s.SpanKind().String(),
		Start:    s.StartTime(),
		Duration: float64(s.EndTime().Sub(s.StartTime()).Microseconds()) / 1000,
		Attrs:    attrs(s.Attributes()),
	}
	if p := s.Parent(); p.IsValid() {
		sp.ParentID = p.SpanID().String()
	}
	sp.Region = sp.Attrs["paymesh.region"]
	for _, l := range s.Links() {
		sp.Links = append(sp.Links, Link{TraceID: l.SpanContext.TraceID().String(), SpanID: l.SpanContext.SpanID().String(),
			Kind: attrs(l.Attributes)["paymesh.link"]})
	}
	for _, e := range s.Events() {
		sp.Events = append(sp.Events, Event{Name: e.Name, At: e.Time, Attrs: attrs(e.Attributes)})
	}
	if st := s.Status(); st.Code.String() == "Error" {
		sp.Error = st.Description
		if sp.Error == "" {
			sp.Error = "error"
		}
	}
	return sp
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	if len(kvs) == 0 {
		return nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// Traces returns the kept traces, newest first.
func (r *Recorder) Traces() []TraceSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []TraceSummary
	for id, t := range r.traces {
		if t.kept {
			out = append(out, t.summary(id))
		}
	}
	slices.SortFunc(out, func(a, b TraceSummary) int { return b.Start.Compare(a.Start) })
	return out
}

// Trace returns a recorded trace, kept or recent.
func (r *Recorder) Trace(id trace.TraceID) (Trace, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.traces[id]
	if !ok {
		return Trace{}, false
	}
	spans := slices.Clone(t.spans)
	slices.SortStableFunc(spans, func(a, b Span) int { return a.Start.Compare(b.Start) })
	return Trace{TraceSummary: t.summary(id), SpanList: spans}, true
}

// summary sums the trace up. Its lists are empty, never nil, when it has
// nothing to list (a retry that no layer caught has no layers): the page
// reads them as arrays.
func (t *traceRec) summary(id trace.TraceID) TraceSummary {
	s := TraceSummary{TraceID: id.String(), Spans: len(t.spans), Regions: list(t.regions),
		Reasons: list(t.reasons), Layers: list(t.layers)}
	for i, sp := range t.spans {
		if i == 0 || sp.Start.Before(s.Start) {
			s.Start, s.Root = sp.Start, sp.Name
		}
	}
	return s
}

// list returns a copy of ss that is not nil (JSON [], not null).
func list(ss []string) []string { return append([]string{}, ss...) }
