package api_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// openAccount posts an account request of client apiKey to region under
// idemKey ("" for none).
func (e *env) openAccount(tb testing.TB, region, apiKey, idemKey, body string) (response, api.AccountBody) {
	tb.Helper()
	r := e.do(tb, region, "POST", "/v1/accounts", apiKey, idemKey, body)
	var a api.AccountBody
	if r.status == http.StatusCreated {
		r.json(tb, &a)
	}
	return r, a
}

// TestOpenAccountRetried: a POST /v1/accounts retried under one
// Idempotency-Key opens one account, whichever regions the retries are
// sent to (the first request's region wins when the body names none), and
// each retry gets the first answer byte for byte with Idempotent-Replayed;
// the same key with another body is 422 and opens nothing; two clients'
// equal keys stay apart; many retries at once open one account; without a
// key every request opens one.
func TestOpenAccountRetried(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	body := `{"currency":"EUR","floor":0}`
	first, a := e.openAccount(t, "eu", keyA, "open-1", body)
	if first.status != http.StatusCreated || first.header.Get(api.HeaderReplayed) != "" || !strings.HasPrefix(a.ID, "eu-") {
		t.Fatalf("first: %d %s (replayed %q), want 201 with an eu account", first.status, first.body, first.header.Get(api.HeaderReplayed))
	}
	// The account moves; a retry still gets the answer as it was opened.
	to := e.account(t, "eu", keyA, 0)
	src := e.account(t, "eu", keyA, 100)
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "into-opened", transferJSON(src, a.ID, 40)); r.status != http.StatusCreated {
		t.Fatalf("transfer into the new account: %d %s", r.status, r.body)
	}
	_ = to
	for _, region := range []string{"us", "ap", "eu", "us"} {
		r, got := e.openAccount(t, region, keyA, "open-1", body)
		if r.status != http.StatusCreated || got.ID != a.ID || r.header.Get(api.HeaderReplayed) != "true" || !bytes.Equal(r.body, first.body) ||
			r.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("retry sent to %s: %d %s (replayed %q, location %q), want the first answer %s replayed",
				region, r.status, r.body, r.header.Get(api.HeaderReplayed), r.header.Get("Location"), first.body)
		}
	}
	if got := e.balance(t, "eu", keyA, a.ID); got != 40 {
		t.Fatalf("the opened account's balance: %d, want 40 (one account, which the transfer reached)", got)
	}

	t.Run("ErrOtherBody", func(t *testing.T) {
		for _, other := range []string{`{"currency":"USD"}`, `{"currency":"EUR","region":"us"}`, `{"currency":"EUR","region":"eu"}`} {
			for _, region := range []string{"eu", "ap"} {
				r, _ := e.openAccount(t, region, keyA, "open-1", other)
				wantProblem(t, "other body "+other+" via "+region, r, http.StatusUnprocessableEntity, ledger.CodeIdempotencyKeyReused)
			}
		}
	})
	t.Run("OtherClientSameKey", func(t *testing.T) {
		r, b := e.openAccount(t, "us", keyB, "open-1", body)
		if r.status != http.StatusCreated || b.ID == a.ID || r.header.Get(api.HeaderReplayed) != "" || !strings.HasPrefix(b.ID, "us-") {
			t.Fatalf("client B, same key, sent to us: %d %s, want a new us account of its own", r.status, r.body)
		}
	})
	t.Run("RegionInBody", func(t *testing.T) {
		r, b := e.openAccount(t, "eu", keyA, "open-ap", `{"currency":"EUR","region":"ap"}`)
		if r.status != http.StatusCreated || !strings.HasPrefix(b.ID, "ap-") {
			t.Fatalf("region ap named, sent to eu: %d %s, want an ap account", r.status, r.body)
		}
		r2, b2 := e.openAccount(t, "us", keyA, "open-ap", `{"currency":"EUR","region":"ap"}`)
		if r2.status != http.StatusCreated || b2.ID != b.ID || r2.header.Get(api.HeaderReplayed) != "true" {
			t.Fatalf("retry sent to us: %d %s, want %s replayed", r2.status, r2.body, b.ID)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		const n = 24
		var wg sync.WaitGroup
		ids := make([]string, n)
		replayed := make([]string, n)
		regions := []string{"eu", "us", "ap"}
		for i := range n {
			wg.Go(func() {
				r, b := e.openAccount(t, regions[i%3], keyA, "open-concurrent", body)
				if r.status != http.StatusCreated {
					t.Errorf("request %d via %s: %d %s", i, regions[i%3], r.status, r.body)
				}
				ids[i], replayed[i] = b.ID, r.header.Get(api.HeaderReplayed)
			})
		}
		wg.Wait()
		opened := 0
		for i := range n {
			if ids[i] != ids[0] {
				t.Fatalf("request %d opened %s, request 0 %s: want one account", i, ids[i], ids[0])
			}
			if replayed[i] == "" {
				opened++
			}
		}
		if opened != 1 {
			t.Fatalf("%d of %d answers are not replays, want 1 (the request that opened it)", opened, n)
		}
		owned := e.c.Region(strings.SplitN(ids[0], "-", 2)[0]).Ledger.Store
		var count int
		if err := owned.Pool().QueryRow(t.Context(), `SELECT count(*) FROM accounts WHERE client_id = 'a' AND idempotency_key = 'open-concurrent'`).Scan(&count); err != nil || count != 1 {
			t.Fatalf("accounts under the key: %d %v, want 1", count, err)
		}
		for _, r := range regions {
			if r == strings.SplitN(ids[0], "-", 2)[0] {
				continue
			}
			if err := e.c.Region(r).Ledger.Store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM accounts WHERE idempotency_key = 'open-concurrent'`).Scan(&count); err != nil || count != 0 {
				t.Fatalf("accounts under the key in %s: %d %v, want none", r, count, err)
			}
		}
	})
	t.Run("NoKey", func(t *testing.T) {
		_, x := e.openAccount(t, "eu", keyA, "", body)
		_, y := e.openAccount(t, "eu", keyA, "", body)
		if x.ID == "" || x.ID == y.ID {
			t.Fatalf("two requests without a key: %s and %s, want two accounts", x.ID, y.ID)
		}
	})
	t.Run("ErrBadKey", func(t *testing.T) {
		for name, key := range map[string]string{"Space": "open 2", "Slash": "open/2", "TooLong": strings.Repeat("k", 256), "NotASCII": "öffnen"} {
			r, _ := e.openAccount(t, "us", keyA, key, body)
			wantProblem(t, name, r, http.StatusBadRequest, ledger.CodeInvalidRequest)
		}
		h := http.Header{}
		h.Add("Idempotency-Key", "twice-1")
		h.Add("Idempotency-Key", "twice-2")
		r := e.doWith(t, "eu", "POST", "/v1/accounts", keyA, body, h)
		wantProblem(t, "two keys", r, http.StatusBadRequest, ledger.CodeInvalidRequest)
	})
	t.Run("ErrBadBodyKeepsKey", func(t *testing.T) {
		// A body refused at the edge records nothing: the key stays free.
		r, _ := e.openAccount(t, "ap", keyA, "open-after-bad", `{"currency":"euro"}`)
		if r.status < 400 || r.status >= 500 {
			t.Fatalf("bad currency: %d %s, want a 4xx", r.status, r.body)
		}
		r, _ = e.openAccount(t, "ap", keyA, "open-after-bad", fmt.Sprintf(`{"currency":"EUR","floor":%d}`, 0))
		if r.status != http.StatusCreated || r.header.Get(api.HeaderReplayed) != "" {
			t.Fatalf("the key after a refused body: %d %s, want a new account", r.status, r.body)
		}
	})
}
