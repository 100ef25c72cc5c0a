package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	apiserver "github.com/paymesh/paymesh/services/api/server"
)

// TestAnswersPushed: with the keys' poll slowed to an hour, a transfer is
// still answered 201 long before the API's wait (3 s) runs out, in the
// region of its source and through another region: the ledger tells the
// waiting API process after COMMIT (through the route stream, the router's
// forward and the ledger's consumer, under the deployed NATS permissions),
// and the API reads its answer then.
func TestAnswersPushed(t *testing.T) {
	e := mustEnv(t, 24*time.Hour, func(c *cluster.Config) {
		c.API = func(_ string, ac *apiserver.Config) { ac.AnswerPoll = time.Hour }
	})
	from := e.account(t, "eu", keyA, 1000)
	to := e.account(t, "eu", keyA, 0)
	for i, region := range []string{"eu", "us", "eu", "ap"} {
		began := time.Now()
		r := e.do(t, region, "POST", "/v1/transfers", keyA, "pushed-"+string(rune('a'+i)), transferJSON(from, to, 1))
		took := time.Since(began)
		if r.status != http.StatusCreated {
			t.Fatalf("transfer %d through %s: got %d %s, want 201", i, region, r.status, r.body)
		}
		if took > 1500*time.Millisecond {
			t.Fatalf("transfer %d through %s answered in %v: the ledger's notification did not wake it (the wait is 3 s)", i, region, took)
		}
	}
	if got := e.balance(t, "eu", keyA, to); got != 4 {
		t.Fatalf("destination: got %d, want 4", got)
	}
}
