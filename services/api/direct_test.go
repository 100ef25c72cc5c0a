package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
)

// TestApplyHere: by default the API applies its region's transfers in a
// transaction of its own, answered from the answer stored with the debit,
// without submitting them to the ledger stream. When that transaction
// fails, the request is submitted to the stream under the same Msg-Id and
// answered from the ledger: one transfer either way, and the replay is the
// first answer.
func TestApplyHere(t *testing.T) {
	var failNext atomic.Bool
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.BeforeCommit = func(context.Context) error {
			if failNext.CompareAndSwap(true, false) {
				return errors.New("the transaction fails before COMMIT")
			}
			return nil
		}
	})
	from := e.account(t, "eu", keyA, 1000)
	to := e.account(t, "eu", keyA, 0)
	reg := e.c.Region("eu")
	h, rs := reg.API, reg.Router.Stats()
	submitted := rs.Submitted.Load()

	here := e.do(t, "eu", "POST", "/v1/transfers", keyA, "here", transferJSON(from, to, 10))
	if here.status != http.StatusCreated {
		t.Fatalf("applied here: %d %s", here.status, here.body)
	}
	if d, n := h.Stats.Direct.Load(), rs.Submitted.Load()-submitted; d != 1 || n != 0 {
		t.Fatalf("applied here: %d answered here and %d submitted to a stream, want 1 and 0", d, n)
	}
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "here", transferJSON(from, to, 10)); r.status != here.status ||
		string(r.body) != string(here.body) || r.header.Get(api.HeaderReplayed) != "true" {
		t.Fatalf("repeat: %d %s, want the first answer replayed", r.status, r.body)
	}

	failNext.Store(true)
	handed := h.Stats.Handed.Load()
	failed := e.do(t, "eu", "POST", "/v1/transfers", keyA, "failed", transferJSON(from, to, 20))
	if failed.status != http.StatusCreated {
		t.Fatalf("after the transaction here failed: %d %s, want 201 from the ledger", failed.status, failed.body)
	}
	if failNext.Load() {
		t.Fatal("no transaction failed")
	}
	if n, d := h.Stats.Handed.Load()-handed, h.Stats.Direct.Load(); n != 1 || d != 1 {
		t.Fatalf("after the transaction here failed: %d handed to the stream, %d answered here in all; want 1 and 1", n, d)
	}
	if n := rs.Submitted.Load() - submitted; n != 1 {
		t.Fatalf("after the transaction here failed: %d submitted to a stream, want 1", n)
	}
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "failed", transferJSON(from, to, 20)); string(r.body) != string(failed.body) {
		t.Fatalf("repeat: %d %s, want %s", r.status, r.body, failed.body)
	}
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, to); got != 30 {
		t.Fatalf("destination: got %d, want 30 (each transfer once)", got)
	}
}

// TestRetryOfAHandedRequest: a request handed to the ledger stream (its
// transaction here failed) and answered 202 while the ledger is held is
// the key's: a retry that reaches another process, which applies here,
// must not make a second transfer of it. It gets the 202 replayed, and the
// one transfer is the one the 202 named.
func TestRetryOfAHandedRequest(t *testing.T) {
	var failNext atomic.Bool
	gate := newLedgerGate()
	t.Cleanup(gate.release)
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.BeforeCommit = func(context.Context) error {
			if failNext.CompareAndSwap(true, false) {
				return errors.New("the transaction fails before COMMIT")
			}
			return nil
		}
		c.Ledger = func(_ string, lc *ledgerd.Config) { lc.WrapJetStream = gate.wrap }
	})
	from := e.account(t, "eu", keyA, 1000)
	to := e.account(t, "eu", keyA, 0)
	second := secondAPI(t, e, time.Second, false)

	failNext.Store(true)
	gate.close()
	first := e.do(t, "eu", "POST", "/v1/transfers", keyA, "k", transferJSON(from, to, 7))
	if first.status != http.StatusAccepted || failNext.Load() {
		gate.release()
		t.Fatalf("handed to the held ledger: %d %s (a transaction failed: %v), want 202", first.status, first.body, !failNext.Load())
	}
	var tb api.TransferBody
	first.json(t, &tb)
	if r := postTransfer(t, second.URL(), "k", transferJSON(from, to, 7)); r.status != first.status || !bytes.Equal(r.body, first.body) ||
		r.header.Get(api.HeaderReplayed) != "true" {
		gate.release()
		t.Fatalf("retry in the other process: %d %s, want the 202 replayed: %s", r.status, r.body, first.body)
	}
	if n := second.API().Stats.Direct.Load(); n != 0 {
		t.Errorf("the other process answered %d from its own transaction, want 0", n)
	}
	gate.release()
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, to); got != 7 {
		t.Fatalf("destination: got %d, want 7 (once)", got)
	}
	if r := e.do(t, "eu", "GET", "/v1/transfers/"+tb.ID, keyA, "", ""); r.status != http.StatusOK {
		t.Fatalf("the transfer the 202 named: %d %s, want it recorded", r.status, r.body)
	}
}

// TestDisconnectWhileApplying: a client that goes away while its request
// waits for a transaction here leaves the request's command to that
// transaction. Its retry in the same process is answered 409 until the
// transaction has decided, and then gets the transaction's answer: it
// never makes a second transfer ID of the key, whose answer the first's
// commit would take back.
func TestDisconnectWhileApplying(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	from := e.account(t, "eu", keyA, 1000)
	to := e.account(t, "eu", keyA, 0)
	reg := e.c.Region("eu")
	gate := &rowGate{t: t, pool: reg.Ledger.Store.Pool(), account: from}
	t.Cleanup(gate.release)

	gate.close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", reg.APIURL+"/v1/transfers", strings.NewReader(transferJSON(from, to, 9)))
	req.Header.Set("Authorization", "Bearer "+keyA)
	req.Header.Set("Idempotency-Key", "gone")
	req.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		gate.release()
		t.Fatalf("the held request was answered %d before its client went away", res.StatusCode)
	}
	gate.held(t) // the handler has returned; its command waits here
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "gone", transferJSON(from, to, 9)); r.status != http.StatusConflict ||
		r.code(t) != api.CodeIdempotencyKeyInFlight {
		gate.release()
		t.Fatalf("retry while the first waits here: %d %s, want 409", r.status, r.body)
	}
	gate.release()
	e.quiet(t)
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "gone", transferJSON(from, to, 9))
	if r.status != http.StatusCreated || r.header.Get(api.HeaderReplayed) != "true" {
		t.Fatalf("retry after: %d %s, want the first transfer's 201 replayed", r.status, r.body)
	}
	if again := e.do(t, "eu", "POST", "/v1/transfers", keyA, "gone", transferJSON(from, to, 9)); !bytes.Equal(again.body, r.body) {
		t.Fatalf("second retry: %s, want %s", again.body, r.body)
	}
	if got := e.balance(t, "eu", keyA, to); got != 9 {
		t.Fatalf("destination: got %d, want 9 (once)", got)
	}
}

// TestAbandonedBeforeItsTransaction: a request whose client goes away while
// it still waits for a transaction here (another group's transaction is
// running) is left out of the next one: it makes no transfer when its
// client has stopped waiting, and its retry applies it once. While it
// waits, the cluster's backlog counts it as work still moving.
func TestAbandonedBeforeItsTransaction(t *testing.T) {
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) { c.APIWait = 45 * time.Second })
	from := e.account(t, "eu", keyA, 1000)
	to := e.account(t, "eu", keyA, 0)
	reg := e.c.Region("eu")
	h := reg.API
	gate := &rowGate{t: t, pool: reg.Ledger.Store.Pool(), account: from}
	t.Cleanup(gate.release)

	gate.close()
	first := make(chan response, 1)
	go func() { first <- e.do(t, "eu", "POST", "/v1/transfers", keyA, "running", transferJSON(from, to, 10)) }()
	gate.held(t) // the first request's transaction waits for the row

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", reg.APIURL+"/v1/transfers", strings.NewReader(transferJSON(from, to, 5)))
	req.Header.Set("Authorization", "Bearer "+keyA)
	req.Header.Set("Idempotency-Key", "abandoned")
	req.Header.Set("Content-Type", "application/json")
	gone := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("answered %d", res.StatusCode)
		}
		gone <- err
	}()
	waitFor(t, "both requests in this process's group", func() bool { return h.Applying() == 2 })
	if n, err := e.c.Backlog(context.Background()); err != nil || n < 2 {
		gate.release()
		t.Fatalf("backlog with two requests waiting here: %d (%v), want them counted", n, err)
	}
	handed := h.Stats.Handed.Load()
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		gate.release()
		t.Fatalf("the abandoned request: %v, want its client's cancel", err)
	}
	waitFor(t, "the abandoned request's handler to stop waiting", func() bool { return h.Stats.Handed.Load() > handed })
	gate.release()
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("the running request: %d %s, want 201", r.status, r.body)
	}
	waitFor(t, "the group to be empty", func() bool { return h.Applying() == 0 })
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, to); got != 10 {
		t.Fatalf("destination: got %d, want 10 (the abandoned request applied nothing)", got)
	}
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "abandoned", transferJSON(from, to, 5)); r.status != http.StatusCreated ||
		r.header.Get(api.HeaderReplayed) == "true" {
		t.Fatalf("retry of the abandoned request: %d %s, want a first 201", r.status, r.body)
	}
	if got := e.balance(t, "eu", keyA, to); got != 15 {
		t.Fatalf("destination: got %d, want 15 (the retry once)", got)
	}
}
