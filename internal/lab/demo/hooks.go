package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/lab/hookaudit"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/receiver"
	"github.com/paymesh/paymesh/services/receiver/receiverd"
)

// hooks is the demo's webhook side: the reference receiver (receiverd, on
// a database of its own) behind a relay that loses a share of its answers
// on the way back, as a network would (paymesh then sends the event
// again), and the demo client's endpoint to it, for every event type.
type hooks struct {
	srv      *receiverd.Server
	relay    *httptest.Server
	target   atomic.Pointer[string] // the receiver's URL, once it runs
	loss     func() bool
	lost     atomic.Int64 // answers the relay lost
	endpoint string
	pool     *pgxpool.Pool // the receiver's database
	c        *cluster.Cluster
	names    []string
	stop     func()
}

// audit is what the report audits: the demo client's events, read from
// each region's database as it is now (a restart opens a new pool).
func (h *hooks) audit() hookaudit.Target {
	t := hookaudit.Target{Client: demoClient, Endpoint: h.endpoint, Receiver: h.pool}
	for _, n := range h.names {
		t.Regions = append(t.Regions, hookaudit.Region{Name: n, Pool: h.c.Region(n).Ledger.Store.Pool()})
	}
	return t
}

// HooksReport is what the demo's webhooks did.
type HooksReport struct {
	hookaudit.Audit
	// AnswersLost is the receiver's 2xx answers the relay lost (each makes
	// paymesh send the event again); Redelivered the events the demo asked
	// paymesh to send again (POST /v1/events/{id}/redeliver).
	AnswersLost, Redelivered int64
	Endpoint, URL            string
	Err                      string
}

// Explained reports whether the duplicates the receiver got are those the
// demo caused, within what paymesh sent: each lost answer and each
// redelivery asked for brought one (at least that many), and none came
// without an attempt beyond an event's first (at most the attempts past
// the first: a slow machine's timeout adds retries, some after the
// receiver applied the event).
func (r HooksReport) Explained() bool {
	return r.AnswersLost+r.Redelivered <= r.Duplicated() && r.Duplicated() <= r.Attempts-r.Events
}

// OK reports whether every event was applied once, or failed visibly.
func (r HooksReport) OK() bool { return r.Err == "" && r.Audit.OK() && r.Waiting == 0 }

// startHooks creates the receiver's database and relay, the endpoint, and
// runs the receiver with the endpoint's secret.
func startHooks(ctx context.Context, c *cluster.Cluster, cfg Config, apiKey string, loss func() bool, names []string) (*hooks, error) {
	h := &hooks{loss: loss, c: c, names: names}
	name := cfg.DatabasePrefix + "receiver"
	url, err := pgdb.Create(ctx, cfg.PostgresURL, name, true)
	if err != nil {
		return nil, fmt.Errorf("the receiver's database: %w", err)
	}
	h.relay = httptest.NewServer(http.HandlerFunc(h.forward))
	cl := &api.Client{BaseURL: c.Region(names[0]).APIURL, APIKey: apiKey}
	ep, err := hookaudit.CreateEndpoint(ctx, cl, h.relay.URL+receiverd.Path, "demo-receiver")
	if err != nil {
		h.relay.Close()
		return nil, err
	}
	h.endpoint = ep.ID
	h.srv, err = receiverd.Open(ctx, receiverd.Config{PostgresURL: url, Secrets: []string{ep.Secret}, MetricsListen: "127.0.0.1:0",
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		h.relay.Close()
		return nil, err
	}
	u := h.srv.URL()
	h.target.Store(&u)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { _ = h.srv.Run(rctx); close(done) }()
	h.stop = func() {
		cancel()
		<-done
		_ = h.srv.Close()
		h.relay.Close()
		if !cfg.Keep {
			_ = pgdb.Drop(context.Background(), cfg.PostgresURL, name)
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		h.stop()
		return nil, err
	}
	stop := h.stop
	h.stop = func() { pool.Close(); stop() }
	h.pool = pool
	if err := h.audit().WaitCopies(ctx, time.Minute); err != nil {
		h.stop()
		return nil, err
	}
	return h, nil
}

// forward relays a delivery to the receiver and its answer back, losing
// a share of the 2xx answers (the receiver has applied the event; paymesh
// hears nothing and sends it again).
func (h *hooks) forward(w http.ResponseWriter, r *http.Request) {
	target := h.target.Load()
	if target == nil {
		http.Error(w, "the receiver is starting", http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 2<<20))
	if err != nil {
		return
	}
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, *target, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 == 2 && h.loss() {
		h.lost.Add(1)
		panic(http.ErrAbortHandler) // the connection closes with no answer
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// report drains the deliveries, then audits them.
func (h *hooks) report(ctx context.Context, redelivered int64) HooksReport {
	rep := HooksReport{AnswersLost: h.lost.Load(), Redelivered: redelivered, Endpoint: h.endpoint, URL: h.srv.URL()}
	if err := h.audit().Drain(ctx, 20*time.Second, 2*time.Minute); err != nil {
		rep.Err = err.Error()
		return rep
	}
	a, err := h.audit().Run(ctx)
	if err != nil {
		rep.Err = err.Error()
	}
	rep.Audit = a
	return rep
}

// print writes the webhook lines of the report.
func (r HooksReport) print(w io.Writer, line func(ok bool, format string, args ...any)) {
	if r.Err != "" {
		line(false, "webhooks: %s", r.Err)
		return
	}
	fmt.Fprintf(w, "webhooks to the reference receiver (%s): %d events emitted, %d delivered, %d failed, %d attempts; "+
		"%d answers lost on the way back, %d events redelivered on request\n",
		r.URL, r.Events, r.Delivered, r.Failed, r.Attempts, r.AnswersLost, r.Redelivered)
	fmt.Fprintf(w, "  duplicates delivered, by cause: ")
	for i, c := range receiver.Causes() {
		if i > 0 {
			fmt.Fprint(w, ", ")
		}
		fmt.Fprintf(w, "%s %d", c, r.Duplicates[c])
	}
	fmt.Fprintf(w, " (%d in all: at least the %d answers lost and redeliveries asked for, at most the %d attempts past each event's first)\n",
		r.Duplicated(), r.AnswersLost+r.Redelivered, r.Attempts-r.Events)
	line(r.OK(), "every event applied once at the receiver: %d applied, %d effects, %d lost, %d applied twice, %d still waiting",
		r.Applied, r.Effects, r.Lost, r.Doubled, r.Waiting)
	for _, f := range append(append([]string{}, r.Unapplied...), r.Mismatch...) {
		fmt.Fprintf(w, "        %s\n", f)
	}
}

// hooks redelivers a share of the events, drains the deliveries and
// audits them.
func (d *driver) hooks(ctx context.Context, h *hooks) HooksReport {
	cl := &api.Client{BaseURL: d.c.Region(d.names[0]).APIURL, APIKey: d.apiKey}
	n, err := h.audit().Redeliver(ctx, cl, 100)
	if err != nil {
		return HooksReport{Err: err.Error()}
	}
	return h.report(ctx, n)
}
