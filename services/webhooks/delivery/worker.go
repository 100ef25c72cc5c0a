// Package delivery sends a region's webhook deliveries: every Poll it
// queues the region's new events for each enabled endpoint
// (services/webhooks/webhookdb's Enqueue), and it runs one lane per
// endpoint, so a slow or failing endpoint holds up its own deliveries
// alone. A lane claims the head delivery of each of its endpoint's
// accounts (an account's events go out in sequence order, one at a time),
// signs and posts them at once, up to Concurrency, and records the batch's
// attempts in one statement: delivered on a 2xx, else tried again on the
// endpoint's Schedule; a delivery out of time fails, and its endpoint is
// disabled. A claim is a lease: a sender that dies mid-batch leaves its
// deliveries to be claimed again when the lease runs out, so an event may
// arrive twice (at least once), never not at all.
package delivery

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/pkg/webhook"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/webhooks"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// Bodies renders events for delivery: the JSON body of each event refs
// name that the region holds (a missing one is left out).
type Bodies interface {
	Render(ctx context.Context, refs []ledger.EventRef) (map[ledger.EventRef][]byte, error)
}

// Config configures a region's delivery worker.
type Config struct {
	Store  *webhookdb.Store
	Bodies Bodies
	Guard  *webhooks.Guard
	// Schedule is when failed deliveries are tried again
	// (webhooks.DefaultSchedule when zero).
	Schedule webhooks.Schedule
	// Timeout bounds one attempt (default 10 s): an answer later than it
	// is a failure, tried again, though the receiver may have acted on it.
	Timeout time.Duration
	// Batch is how many deliveries a lane claims at a time (default 32),
	// Concurrency how many of them it sends at once (default 8).
	Batch, Concurrency int
	// Poll is how often new events are queued and the endpoints re-read
	// (default 200 ms).
	Poll time.Duration
	// Retention is how long ended deliveries and attempts are kept
	// (default 30 days, as the events they name); pruned every hour.
	Retention time.Duration
	// Disabled, if set, is told of each endpoint disabled here, to record
	// it at the endpoint's home region.
	Disabled func(ctx context.Context, e webhooks.Endpoint, reason string)
	Stats    *Stats
	Log      *slog.Logger
}

// Stats counts what a worker did. The zero value is ready.
type Stats struct {
	Attempts  atomic.Int64 // attempts sent
	Delivered atomic.Int64 // deliveries answered 2xx
	Failures  atomic.Int64 // attempts that failed (no answer, or not 2xx)
	Retries   atomic.Int64 // attempts after a delivery's first
	GaveUp    atomic.Int64 // deliveries that failed for good
	// Latency, if set, observes each delivered event's time from queued
	// to its 2xx, by endpoint.
	Latency func(endpoint string, d time.Duration)

	mu         sync.Mutex
	byEndpoint map[string]*EndpointCounts
}

// EndpointCounts counts one endpoint's attempts in this region.
type EndpointCounts struct {
	Attempts, Delivered, Failures, Retries, GaveUp atomic.Int64
}

// Endpoint returns the counts of an endpoint, made at its first use.
func (s *Stats) Endpoint(id string) *EndpointCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.byEndpoint[id]
	if !ok {
		if s.byEndpoint == nil {
			s.byEndpoint = map[string]*EndpointCounts{}
		}
		c = &EndpointCounts{}
		s.byEndpoint[id] = c
	}
	return c
}

// Endpoints calls f with each endpoint's counts.
func (s *Stats) Endpoints(f func(id string, c *EndpointCounts)) {
	s.mu.Lock()
	ids := make(map[string]*EndpointCounts, len(s.byEndpoint))
	for id, c := range s.byEndpoint {
		ids[id] = c
	}
	s.mu.Unlock()
	for id, c := range ids {
		f(id, c)
	}
}

// Worker is a region's delivery worker.
type Worker struct {
	cfg    Config
	client *http.Client
	mu     sync.Mutex
	lanes  map[string]*lane
}

// New returns a worker; Run runs it.
func New(cfg Config) (*Worker, error) {
	if cfg.Schedule == (webhooks.Schedule{}) {
		cfg.Schedule = webhooks.DefaultSchedule
	}
	if err := cfg.Schedule.Check(); err != nil {
		return nil, err
	}
	if cfg.Store == nil || cfg.Bodies == nil || cfg.Guard == nil {
		return nil, fmt.Errorf("delivery: a store, the event bodies and a guard are required")
	}
	cfg.Timeout = cmpOr(cfg.Timeout, 10*time.Second)
	cfg.Retention = cmpOr(cfg.Retention, 30*24*time.Hour)
	cfg.Poll = cmpOr(cfg.Poll, 200*time.Millisecond)
	cfg.Batch, cfg.Concurrency = cmpOr(cfg.Batch, 32), cmpOr(cfg.Concurrency, 8)
	if cfg.Stats == nil {
		cfg.Stats = &Stats{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Worker{cfg: cfg, client: cfg.Guard.Client(cfg.Timeout), lanes: map[string]*lane{}}, nil
}

func cmpOr[T int | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// Run queues and sends deliveries until ctx ends.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(w.cfg.Poll)
	defer tick.Stop()
	prune := time.NewTicker(time.Hour)
	defer prune.Stop()
	for {
		if err := w.round(ctx, &wg); err != nil && ctx.Err() == nil {
			w.cfg.Log.Warn("webhook delivery round failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-prune.C:
			if _, err := w.cfg.Store.Prune(ctx, time.Now().Add(-w.cfg.Retention), 1000); err != nil && ctx.Err() == nil {
				w.cfg.Log.Warn("webhook prune failed", "err", err)
			}
		case <-tick.C:
		}
	}
}

// round queues the new events, starts a lane for each new enabled
// endpoint and stops those of the others, and wakes the lanes.
func (w *Worker) round(ctx context.Context, wg *sync.WaitGroup) error {
	for {
		_, read, err := w.cfg.Store.Enqueue(ctx, webhookdb.DefaultEnqueueBatch)
		if err != nil {
			return err
		}
		if read < webhookdb.DefaultEnqueueBatch {
			break
		}
	}
	eps, err := w.cfg.Store.Enabled(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	live := make(map[string]bool, len(eps))
	for _, e := range eps {
		live[e.ID] = true
		l, ok := w.lanes[e.ID]
		if !ok {
			lctx, cancel := context.WithCancel(ctx)
			l = &lane{w: w, wake: make(chan struct{}, 1), stop: cancel}
			l.endpoint.Store(&e)
			w.lanes[e.ID] = l
			wg.Go(func() { l.run(lctx) })
		} else {
			l.endpoint.Store(&e)
		}
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	for id, l := range w.lanes {
		if !live[id] {
			l.stop()
			delete(w.lanes, id)
		}
	}
	return nil
}

// lease is how long a claim holds its deliveries: the batch's rounds of
// Concurrency sends, each up to Timeout, and one more to record them.
func (w *Worker) lease() time.Duration {
	rounds := (w.cfg.Batch + w.cfg.Concurrency - 1) / w.cfg.Concurrency
	return time.Duration(rounds+1)*w.cfg.Timeout + w.cfg.Poll
}

// lane sends one endpoint's deliveries.
type lane struct {
	w        *Worker
	endpoint atomic.Pointer[webhooks.Endpoint]
	wake     chan struct{}
	stop     context.CancelFunc
}

func (l *lane) run(ctx context.Context) {
	for ctx.Err() == nil {
		n, err := l.batch(ctx)
		if err != nil && ctx.Err() == nil {
			l.w.cfg.Log.Warn("webhook lane failed", "endpoint", l.endpoint.Load().ID, "err", err)
		}
		if n > 0 && err == nil {
			continue // more may be due: the heads behind those just sent
		}
		select {
		case <-ctx.Done():
		case <-l.wake:
		}
	}
}

// batch claims, sends and records one batch, and returns its size.
func (l *lane) batch(ctx context.Context) (int, error) {
	cfg := &l.w.cfg
	e := *l.endpoint.Load()
	claims, err := cfg.Store.Claim(ctx, e.ID, cfg.Batch, l.w.lease())
	if err != nil || len(claims) == 0 {
		return 0, err
	}
	refs := make([]ledger.EventRef, len(claims))
	for i, c := range claims {
		refs[i] = c.Event
	}
	bodies, err := cfg.Bodies.Render(ctx, refs)
	if err != nil {
		return 0, err // the leases run out, and the deliveries are claimed again
	}
	results := make([]webhookdb.Result, len(claims))
	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	for i, c := range claims {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = l.send(ctx, e, c, bodies[c.Event])
		})
	}
	wg.Wait()
	// Recorded even when ctx has ended meanwhile: what was sent is known.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := cfg.Store.Finish(rctx, e.ID, results); err != nil {
		return 0, err
	}
	for _, r := range results {
		if r.Next.IsZero() && r.Err != "" {
			l.disable(rctx, e, fmt.Sprintf("event %s failed for %v: %s", r.Event.ID(), cfg.Schedule.MaxAge, r.Err))
			break
		}
	}
	return len(claims), nil
}

// send posts one delivery and says what came of it.
func (l *lane) send(ctx context.Context, e webhooks.Endpoint, c webhookdb.Claim, body []byte) webhookdb.Result {
	cfg := &l.w.cfg
	st, ep := cfg.Stats, cfg.Stats.Endpoint(e.ID)
	r := webhookdb.Result{Claim: c, At: time.Now()}
	st.Attempts.Add(1)
	ep.Attempts.Add(1)
	if c.Attempt > 1 {
		st.Retries.Add(1)
		ep.Retries.Add(1)
	}
	if body == nil {
		r.Err = "the event is no longer kept" // pruned: no retry brings it back
		st.GaveUp.Add(1)
		ep.GaveUp.Add(1)
		return r
	}
	r.StatusCode, r.Err = l.post(ctx, e, c, r.At, body)
	r.Duration = time.Since(r.At)
	if r.Err == "" {
		st.Delivered.Add(1)
		ep.Delivered.Add(1)
		if st.Latency != nil {
			st.Latency(e.ID, time.Since(c.Queued))
		}
		return r
	}
	st.Failures.Add(1)
	ep.Failures.Add(1)
	next, ok := cfg.Schedule.Next(c.Queued, time.Now(), c.Attempt, rand.Float64()*2-1)
	if ok {
		r.Next = next
	} else {
		st.GaveUp.Add(1)
		ep.GaveUp.Add(1)
	}
	return r
}

// post sends one signed delivery and returns the status and, unless it is
// a 2xx, why it failed.
func (l *lane) post(ctx context.Context, e webhooks.Endpoint, c webhookdb.Claim, at time.Time, body []byte) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "paymesh-webhooks/1")
	if err := webhook.Sign(req.Header, c.Event.ID(), at, body, e.Secrets(at)...); err != nil {
		return 0, err.Error()
	}
	req.Header.Set(webhook.HeaderAttempt, strconv.Itoa(c.Attempt))
	if c.Redeliveries > 0 {
		req.Header.Set(webhook.HeaderRedelivery, strconv.Itoa(c.Redeliveries))
	}
	resp, err := l.w.client.Do(req)
	if err != nil {
		return 0, truncate(err.Error())
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Sprintf("answered %d", resp.StatusCode)
	}
	return resp.StatusCode, ""
}

func truncate(s string) string {
	if len(s) > 500 {
		return s[:500] + "…"
	}
	return s
}

// disable disables the endpoint here, stops its lane, and tells its home.
func (l *lane) disable(ctx context.Context, e webhooks.Endpoint, reason string) {
	cfg := &l.w.cfg
	changed, err := cfg.Store.Disable(ctx, e.ID, reason)
	if err != nil {
		cfg.Log.Warn("webhook endpoint not disabled", "endpoint", e.ID, "err", err)
		return
	}
	if !changed {
		return
	}
	cfg.Log.Warn("webhook endpoint disabled", "endpoint", e.ID, "reason", reason)
	l.stop()
	if cfg.Disabled != nil {
		cfg.Disabled(ctx, e, reason)
	}
}
