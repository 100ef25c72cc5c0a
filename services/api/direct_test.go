package api_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
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
