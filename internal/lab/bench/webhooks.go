package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/pkg/webhook"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/webhooks"
	"github.com/paymesh/paymesh/services/webhooks/delivery"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// HookRun is what the webhooks scenario's delivery did: the events of the
// run and those delivered by the end of the drain (its bound, or all),
// how long after the last commit the last delivery came, and the delivery
// rate (first publish to last 2xx).
type HookRun struct {
	Events       int64   `json:"events"`
	Delivered    int64   `json:"delivered"`
	DrainSeconds float64 `json:"drain_seconds"`
	Rate         float64 `json:"rate"`
}

// hookRig is the webhooks scenario's delivery worker, on the run's
// database, sending every event of the bench's client to a loopback sink
// that answers 200 at once: the cost measured is paymesh's (queueing,
// claims, rendering, signing, the attempts' records), not a receiver's.
type hookRig struct {
	sink      *httptest.Server
	delivered atomic.Int64
	last      atomic.Int64 // Unix ns of the last 2xx
	stop      context.CancelFunc
	done      chan struct{}
}

// openHooks migrates the webhooks' tables, creates the bench client's
// endpoint (before its accounts, so that every event is queued) and
// starts the worker.
func openHooks(ctx context.Context, store *postgres.Store) (*hookRig, error) {
	pool := store.Pool()
	if err := pgdb.Migrate(ctx, pool, webhookdb.Migrations()); err != nil {
		return nil, err
	}
	h := &hookRig{done: make(chan struct{})}
	h.sink = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.delivered.Add(1)
		h.last.Store(time.Now().UnixNano())
	}))
	hooks := webhookdb.New(pool)
	secret, err := webhook.NewSecret()
	if err != nil {
		h.sink.Close()
		return nil, err
	}
	now := time.Now()
	id := fmt.Sprintf("%s-bench-hook", region)
	if _, _, err := hooks.Create(ctx, webhooks.Endpoint{ID: id, Client: Client, URL: h.sink.URL, Secret: secret, CreatedAt: now, UpdatedAt: now}, "", nil); err != nil {
		h.sink.Close()
		return nil, err
	}
	w, err := delivery.New(delivery.Config{Store: hooks, Bodies: api.EventBodies{Ledger: store}, Guard: webhooks.NewGuard([]string{"127.0.0.1"}),
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		h.sink.Close()
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h.stop = stop
	go func() { _ = w.Run(runCtx); close(h.done) }()
	return h, nil
}

// drain waits, up to bound, until every event of the run is delivered,
// and returns what the delivery did by then; run is the ledger's run.
func (h *hookRig) drain(ctx context.Context, store *postgres.Store, run LedgerRun, started time.Time, bound time.Duration) (HookRun, error) {
	var events int64
	if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE client_id = $1`, Client).Scan(&events); err != nil {
		return HookRun{}, err
	}
	committed := started.Add(time.Duration(run.Seconds * float64(time.Second)))
	for deadline := time.Now().Add(bound); h.delivered.Load() < events && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return HookRun{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	r := HookRun{Events: events, Delivered: h.delivered.Load()}
	last := time.Unix(0, h.last.Load())
	r.DrainSeconds = max(0, last.Sub(committed).Seconds())
	if s := last.Sub(started).Seconds(); s > 0 {
		r.Rate = float64(r.Delivered) / s
	}
	return r, nil
}

func (h *hookRig) close() {
	h.stop()
	<-h.done
	h.sink.Close()
}
