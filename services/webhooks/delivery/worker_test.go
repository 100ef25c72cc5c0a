package delivery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/pkg/webhook"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/webhooks"
	"github.com/paymesh/paymesh/services/webhooks/delivery"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// region is one region's ledger with its webhook store.
type region struct {
	f     *ledgertest.Fixture
	store *webhookdb.Store
}

func newRegion(t *testing.T) region {
	t.Helper()
	f := ledgertest.New(t)
	if err := pgdb.Migrate(context.Background(), f.Pool, webhookdb.Migrations()); err != nil {
		t.Fatal(err)
	}
	return region{f: f, store: webhookdb.New(f.Pool)}
}

// endpoint creates an endpoint of client c1 for url.
func (r region) endpoint(t *testing.T, url string, types ...ledger.EventType) webhooks.Endpoint {
	t.Helper()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	e, _, err := r.store.Create(context.Background(), webhooks.Endpoint{ID: r.f.ID(t), Client: "c1", URL: url, Types: types,
		Secret: secret, CreatedAt: now, UpdatedAt: now}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// start runs a worker until the test ends.
func (r region) start(t *testing.T, cfg delivery.Config) *delivery.Stats {
	t.Helper()
	cfg.Store, cfg.Bodies = r.store, api.EventBodies{Ledger: r.f.Store}
	if cfg.Guard == nil {
		cfg.Guard = webhooks.NewGuard([]string{"127.0.0.1"})
	}
	if cfg.Stats == nil {
		cfg.Stats = &delivery.Stats{}
	}
	cfg.Poll = 20 * time.Millisecond
	w, err := delivery.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return cfg.Stats
}

// receiver records the deliveries it verifies, and answers with answer.
type receiver struct {
	mu     sync.Mutex
	secret string
	got    []api.EventBody
	bad    []string
	answer func(n int) int // the status of the n-th delivery (from 1)
	calls  int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.calls++
	id, err := webhook.Verify(r.Header, body, rc.secret)
	var e api.EventBody
	if err == nil {
		err = json.Unmarshal(body, &e)
	}
	if err == nil && e.ID != id {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		rc.bad = append(rc.bad, err.Error())
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	status := http.StatusOK
	if rc.answer != nil {
		status = rc.answer(rc.calls)
	}
	if status < 300 {
		rc.got = append(rc.got, e)
	}
	w.WriteHeader(status)
}

func (rc *receiver) received() []api.EventBody {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]api.EventBody(nil), rc.got...)
}

// waitFor waits until ok, failing with what() past a generous bound.
func waitFor(t *testing.T, what func() string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serve starts a loopback receiver.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// TestOneAccountsEventsArriveInOrder: 1,000 events of one account reach
// the endpoint signed, each once, in sequence order, and only those after
// the endpoint was created.
func TestOneAccountsEventsArriveInOrder(t *testing.T) {
	r := newRegion(t)
	a, b := r.f.Account(t, "EUR", 1_000_000), r.f.Account(t, "EUR", 0)
	before := r.f.Count(t, `SELECT max(sequence) FROM events WHERE account_id = $1`, a)
	rc := &receiver{}
	srv := serve(t, rc)
	e := r.endpoint(t, srv.URL+"/hooks")
	rc.mu.Lock()
	rc.secret = e.Secret
	rc.mu.Unlock()
	stats := r.start(t, delivery.Config{})
	for range 10 { // 500 transfers, 50 a batch: created and completed each
		cmds := make([]ledger.Command, 50)
		for i := range cmds {
			cmds[i] = r.f.Transfer(t, a, b, 1)
		}
		r.f.Apply(t, cmds...)
	}
	waitFor(t, func() string { return "deliveries: " + strconv.Itoa(len(rc.received())) }, func() bool { return len(rc.received()) >= 1000 })
	got := rc.received()
	if len(rc.bad) > 0 {
		t.Fatalf("deliveries that did not verify: %v", rc.bad)
	}
	var first int64
	for i, ev := range got {
		if ev.Account != a {
			t.Fatalf("delivery %d is of account %s, want only %s's (b's credits order no event)", i, ev.Account, a)
		}
		if i == 0 {
			first = ev.Sequence
			continue
		}
		if ev.Sequence != got[i-1].Sequence+1 {
			t.Fatalf("delivery %d is event %s after %s: not in sequence order", i, ev.ID, got[i-1].ID)
		}
	}
	if first != int64(before)+1 {
		t.Errorf("the first delivery is sequence %d, want %d (the first event after the endpoint was created)", first, before+1)
	}
	if len(got) != 1000 || stats.Delivered.Load() != 1000 {
		t.Errorf("received %d, delivered %d: want 1000 each", len(got), stats.Delivered.Load())
	}
}

// TestFailingAndSlowEndpointsHoldUpOnlyThemselves: an endpoint that
// answers 500 three times gets every event on the fourth attempt, each
// attempt recorded; one that answers past the timeout is tried again; a
// third, healthy endpoint of the same client meanwhile gets every event
// at once.
func TestFailingAndSlowEndpointsHoldUpOnlyThemselves(t *testing.T) {
	r := newRegion(t)
	a, b := r.f.Account(t, "EUR", 1000), r.f.Account(t, "EUR", 0)
	failing := &receiver{answer: func(n int) int {
		if n <= 3 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}}
	release := make(chan struct{})
	slow := &receiver{}
	healthy := &receiver{}
	ef := r.endpoint(t, serve(t, failing).URL)
	es := r.endpoint(t, serve(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		<-release // past the worker's timeout, until the test ends
		slow.ServeHTTP(w, req)
	})).URL)
	eh := r.endpoint(t, serve(t, healthy).URL, ledger.TransferCompleted)
	failing.secret, slow.secret, healthy.secret = ef.Secret, es.Secret, eh.Secret
	defer close(release)
	stats := r.start(t, delivery.Config{Timeout: 300 * time.Millisecond,
		Schedule: webhooks.Schedule{First: 10 * time.Millisecond, Longest: 20 * time.Millisecond, MaxAge: time.Hour}})
	r.f.MustApply(t, r.f.Transfer(t, a, b, 5))
	waitFor(t, func() string { return "healthy endpoint" }, func() bool { return len(healthy.received()) == 1 })
	if got := healthy.received()[0].Type; got != string(ledger.TransferCompleted) {
		t.Errorf("the endpoint of transfer.completed alone got %s", got)
	}
	waitFor(t, func() string {
		ds, err := r.store.Deliveries(context.Background(), ef.ID)
		return fmt.Sprintf("failing endpoint: %d calls, bad %v, deliveries %+v %v", failing.calls, failing.bad, ds, err)
	}, func() bool { return len(failing.received()) >= 1 })
	// One account's events go one at a time: the second waits for the first.
	waitFor(t, func() string { return "failing endpoint's second" }, func() bool { return len(failing.received()) == 2 })
	attempts, err := r.store.Attempts(context.Background(), ef.ID, &ledger.EventRef{Account: a, Sequence: failing.received()[0].Sequence}, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	var codes []int
	for _, at := range attempts {
		codes = append(codes, at.StatusCode)
	}
	if want := []int{200, 500, 500, 500}; !slices.Equal(codes, want) {
		t.Errorf("attempts of the first event, newest first: %v, want %v", codes, want)
	}
	waitFor(t, func() string { return "slow endpoint's retries" }, func() bool { return stats.Retries.Load() >= 5 })
	ds, err := r.store.Deliveries(context.Background(), es.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 || ds[0].Status != "pending" || ds[0].Attempts < 2 || !strings.Contains(ds[0].Err, "Timeout") {
		t.Errorf("the slow endpoint's deliveries: %+v, want its first pending after timed-out attempts", ds)
	}
}

// TestGivingUpDisablesTheEndpoint: deliveries that fail past MaxAge fail
// for good; the endpoint is disabled, the callback told, and its other
// deliveries end failed, visible with their attempts.
func TestGivingUpDisablesTheEndpoint(t *testing.T) {
	r := newRegion(t)
	a, b := r.f.Account(t, "EUR", 1000), r.f.Account(t, "EUR", 0)
	down := &receiver{answer: func(int) int { return http.StatusServiceUnavailable }}
	e := r.endpoint(t, serve(t, down).URL)
	down.secret = e.Secret
	told := make(chan string, 1)
	r.start(t, delivery.Config{Schedule: webhooks.Schedule{First: 10 * time.Millisecond, Longest: 40 * time.Millisecond, MaxAge: 300 * time.Millisecond},
		Disabled: func(_ context.Context, d webhooks.Endpoint, reason string) { told <- d.ID + ": " + reason }})
	r.f.MustApply(t, r.f.Transfer(t, a, b, 5))
	var reason string
	select {
	case reason = <-told:
	case <-time.After(60 * time.Second):
		t.Fatal("the endpoint was never disabled")
	}
	if !strings.HasPrefix(reason, e.ID+": event ") || !strings.Contains(reason, "answered 503") {
		t.Errorf("disabled with %q", reason)
	}
	got, _, err := r.store.Endpoint(context.Background(), e.ID)
	if err != nil || got.Status != webhooks.Disabled || got.DisabledReason == "" {
		t.Fatalf("endpoint after giving up: %+v, %v", got, err)
	}
	ds, err := r.store.Deliveries(context.Background(), e.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Status != "failed" || d.Err == "" {
			t.Errorf("delivery %+v: want failed, with why", d)
		}
	}
	if len(ds) != 2 || ds[0].Attempts < 3 {
		t.Errorf("deliveries %+v: want both events', the first tried several times", ds)
	}
}

// TestGuardRefusesAtDeliveryAndRedirectsAreNotFollowed: an endpoint
// pointing at loopback, which no operator allowed, gets nothing: the dial
// is refused after resolution; and a 302 is a failed attempt, its target
// never called.
func TestGuardRefusesAtDeliveryAndRedirectsAreNotFollowed(t *testing.T) {
	r := newRegion(t)
	a, b := r.f.Account(t, "EUR", 1000), r.f.Account(t, "EUR", 0)
	target := &receiver{}
	tsrv := serve(t, target)
	redirect := serve(t, http.RedirectHandler(tsrv.URL, http.StatusFound))
	inner := &receiver{}
	isrv := serve(t, inner)
	// The guard allows the redirecting host by name alone: localhost, not
	// 127.0.0.1, which the target and the inner receiver are served on.
	er := r.endpoint(t, strings.Replace(redirect.URL, "127.0.0.1", "localhost", 1))
	ei := r.endpoint(t, isrv.URL)
	target.secret, inner.secret = er.Secret, ei.Secret
	r.start(t, delivery.Config{Guard: webhooks.NewGuard([]string{"localhost"}),
		Schedule: webhooks.Schedule{First: time.Hour, Longest: time.Hour, MaxAge: 2 * time.Hour}})
	r.f.MustApply(t, r.f.Transfer(t, a, b, 5))
	recorded := func(e webhooks.Endpoint) bool {
		ds, err := r.store.Deliveries(context.Background(), e.ID)
		return err == nil && len(ds) > 0 && ds[0].Err != ""
	}
	waitFor(t, func() string { return "two failed attempts recorded" }, func() bool { return recorded(er) && recorded(ei) })
	for _, c := range []struct {
		e    webhooks.Endpoint
		want string
	}{{er, "answered 302"}, {ei, "not a public address"}} {
		ds, err := r.store.Deliveries(context.Background(), c.e.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 || !strings.Contains(ds[0].Err, c.want) {
			t.Errorf("deliveries to %s: %+v, want the first failed with %q", c.e.URL, ds, c.want)
		}
	}
	target.mu.Lock()
	inner.mu.Lock()
	defer target.mu.Unlock()
	defer inner.mu.Unlock()
	if target.calls+inner.calls != 0 {
		t.Errorf("the redirect's target was called %d times, the refused receiver %d", target.calls, inner.calls)
	}
}
