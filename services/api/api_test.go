package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/apicheck"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

const (
	keyA = "key-a-0123456789abcdef"
	keyB = "key-b-0123456789abcdef"
	keyC = "key-c-slow-client-0123"
)

type env struct {
	c    *cluster.Cluster
	topo *natsembed.Topology
	gens map[string]*idgen.Generator
}

// id mints a fresh ID in region.
func (e *env) id(tb testing.TB, region string) string {
	tb.Helper()
	s, err := e.gens[region].NextString()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// mustEnv runs three regions with their APIs and three clients: A and B,
// and C with a rate limit of 2 requests per second.
// Each of opts may change the cluster's configuration before it starts.
func mustEnv(tb testing.TB, keyTTL time.Duration, opts ...func(*cluster.Config)) *env {
	tb.Helper()
	topo := natsembed.MustStartTopology(tb, "eu", "us", "ap")
	ctx := context.Background()
	cfg := cluster.Config{
		Regions: map[string]uint8{"eu": 1, "us": 2, "ap": 3}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_api_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e6),
		Shards:         4, BatchSize: 64, AckWait: 2 * time.Second, APIWait: 3 * time.Second, KeyTTL: keyTTL,
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Stop()
		_ = c.Drop(context.Background())
	})
	for _, s := range c.APIStores() {
		for _, cl := range []struct {
			c   api.RegisteredClient
			key string
		}{{api.RegisteredClient{ID: "a", Name: "A"}, keyA}, {api.RegisteredClient{ID: "b", Name: "B"}, keyB}, {api.RegisteredClient{ID: "c", Name: "C", RatePerSec: 2}, keyC}} {
			if err := s.PutClient(ctx, cl.c, cl.key); err != nil {
				tb.Fatal(err)
			}
		}
	}
	e := &env{c: c, topo: topo, gens: map[string]*idgen.Generator{}}
	for _, r := range []string{"eu", "us", "ap"} {
		if e.gens[r], err = idgen.NewGenerator(c.IDs(), r, 901); err != nil {
			tb.Fatal(err)
		}
	}
	return e
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(tb testing.TB, v any) {
	tb.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		tb.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r response) code(tb testing.TB) ledger.Code {
	tb.Helper()
	var p api.Problem
	r.json(tb, &p)
	if r.header.Get("Content-Type") != "application/problem+json" {
		tb.Errorf("problem content type %q", r.header.Get("Content-Type"))
	}
	return p.Code
}

func (e *env) do(tb testing.TB, region, method, path, apiKey, idemKey, body string) response {
	tb.Helper()
	h := http.Header{}
	if idemKey != "" {
		h.Set("Idempotency-Key", idemKey)
	}
	return e.doWith(tb, region, method, path, apiKey, body, h)
}

// doWith sends a request with the given headers and the client's API key.
func (e *env) doWith(tb testing.TB, region, method, path, apiKey, body string, h http.Header) response {
	tb.Helper()
	return send(tb, method, e.c.Region(region).APIURL+path, apiKey, body, h)
}

// postTransfer sends a transfer request of client A, with its
// Idempotency-Key, to the API at base (one the cluster did not start).
func postTransfer(tb testing.TB, base, idemKey, body string) response {
	tb.Helper()
	h := http.Header{}
	h.Set("Idempotency-Key", idemKey)
	h.Set("Content-Type", "application/json")
	return send(tb, "POST", base+"/v1/transfers", keyA, body, h)
}

// send sends a request with the given headers and API key.
func send(tb testing.TB, method, url, apiKey, body string, h http.Header) response {
	tb.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header = h
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	res, err := apicheck.Client(tb).Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// account opens an account for the client in region and funds it.
func (e *env) account(tb testing.TB, region, apiKey string, funds int64) string {
	tb.Helper()
	r := e.do(tb, region, "POST", "/v1/accounts", apiKey, "", `{"currency":"EUR"}`)
	if r.status != http.StatusCreated {
		tb.Fatalf("open account: %d %s", r.status, r.body)
	}
	var a api.AccountBody
	r.json(tb, &a)
	if funds > 0 {
		fund := ledger.Command{Type: ledger.TypeFund, TransferID: e.id(tb, region), ClientID: "ops", IdempotencyKey: "fund-" + a.ID,
			To: a.ID, Amount: funds, Currency: "EUR", CreatedAt: time.Now()}
		if err := e.c.Submit(context.Background(), region, fund); err != nil {
			tb.Fatal(err)
		}
		e.quiet(tb)
	}
	return a.ID
}

func (e *env) quiet(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.c.WaitQuiet(ctx); err != nil {
		tb.Fatal(err)
	}
}

func (e *env) balance(tb testing.TB, region, apiKey, id string) int64 {
	tb.Helper()
	return e.accountBody(tb, region, apiKey, id).Balance
}

func (e *env) accountBody(tb testing.TB, region, apiKey, id string) api.AccountBody {
	tb.Helper()
	r := e.do(tb, region, "GET", "/v1/accounts/"+id, apiKey, "", "")
	if r.status != http.StatusOK {
		tb.Fatalf("get account %s: %d %s", id, r.status, r.body)
	}
	var a api.AccountBody
	r.json(tb, &a)
	return a
}

func transferJSON(from, to string, amount int64) string {
	return fmt.Sprintf(`{"from":%q,"to":%q,"amount":%d,"currency":"EUR"}`, from, to, amount)
}

// TestIdempotencyConformance covers the Idempotency-Key rules over HTTP
// against three running regions.
func TestIdempotencyConformance(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	a1 := e.account(t, "eu", keyA, 1000)
	a2 := e.account(t, "us", keyA, 0)
	a3 := e.account(t, "eu", keyA, 0)

	t.Run("MissingKeyIs400", func(t *testing.T) {
		r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "", transferJSON(a1, a3, 1))
		if r.status != 400 || r.code(t) != api.CodeIdempotencyKeyMissing {
			t.Fatalf("got %d %s", r.status, r.body)
		}
	})
	t.Run("NoAPIKeyIs401", func(t *testing.T) {
		for _, k := range []string{"", "wrong"} {
			if r := e.do(t, "eu", "POST", "/v1/transfers", k, "k", transferJSON(a1, a3, 1)); r.status != 401 {
				t.Fatalf("api key %q: got %d %s", k, r.status, r.body)
			}
		}
	})
	t.Run("ReplaySameRegion", func(t *testing.T) {
		first := e.do(t, "eu", "POST", "/v1/transfers", keyA, "same-region", transferJSON(a1, a3, 10))
		if first.status != http.StatusCreated || first.header.Get(api.HeaderReplayed) != "" {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		again := e.do(t, "eu", "POST", "/v1/transfers", keyA, "same-region", transferJSON(a1, a3, 10))
		if again.status != first.status || !bytes.Equal(again.body, first.body) || again.header.Get(api.HeaderReplayed) != "true" {
			t.Fatalf("replay: %d %s (replayed=%q), want %d %s", again.status, again.body, again.header.Get(api.HeaderReplayed), first.status, first.body)
		}
		if got := e.balance(t, "eu", keyA, a3); got != 10 {
			t.Fatalf("destination: got %d, want 10", got)
		}
	})
	t.Run("ReplayAcrossRegions", func(t *testing.T) {
		// Sent in ap for an eu account going to us; repeated in us and eu.
		first := e.do(t, "ap", "POST", "/v1/transfers", keyA, "cross", transferJSON(a1, a2, 20))
		if first.status != http.StatusCreated && first.status != http.StatusAccepted {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		for _, region := range []string{"us", "eu", "ap"} {
			again := e.do(t, region, "POST", "/v1/transfers", keyA, "cross", transferJSON(a1, a2, 20))
			if again.status != first.status || !bytes.Equal(again.body, first.body) || again.header.Get(api.HeaderReplayed) != "true" {
				t.Fatalf("replay in %s: %d %s, want %d %s", region, again.status, again.body, first.status, first.body)
			}
		}
		e.quiet(t)
		if got := e.balance(t, "ap", keyA, a2); got != 20 {
			t.Fatalf("destination: got %d, want 20", got)
		}
	})
	t.Run("OtherBodyIs422", func(t *testing.T) {
		r := e.do(t, "us", "POST", "/v1/transfers", keyA, "same-region", transferJSON(a1, a3, 11))
		if r.status != 422 || r.code(t) != ledger.CodeIdempotencyKeyReused {
			t.Fatalf("got %d %s", r.status, r.body)
		}
	})
	t.Run("KeysAreScopedToTheClient", func(t *testing.T) {
		b1 := e.account(t, "eu", keyB, 100)
		b2 := e.account(t, "eu", keyB, 0)
		r := e.do(t, "eu", "POST", "/v1/transfers", keyB, "same-region", transferJSON(b1, b2, 5))
		if r.status != http.StatusCreated || r.header.Get(api.HeaderReplayed) != "" {
			t.Fatalf("B with A's key string: %d %s, want a new transfer", r.status, r.body)
		}
	})
	t.Run("RefusedTransferIsStoredToo", func(t *testing.T) {
		first := e.do(t, "eu", "POST", "/v1/transfers", keyA, "too-much", transferJSON(a1, a3, 1_000_000))
		if first.status != 422 || first.code(t) != ledger.CodeInsufficientFunds {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		again := e.do(t, "us", "POST", "/v1/transfers", keyA, "too-much", transferJSON(a1, a3, 1_000_000))
		if again.status != 422 || !bytes.Equal(again.body, first.body) || again.header.Get(api.HeaderReplayed) != "true" {
			t.Fatalf("replay: %d %s", again.status, again.body)
		}
	})
	t.Run("CrossRegionToMissingAccountRefunds", func(t *testing.T) {
		before := e.balance(t, "eu", keyA, a1)
		ghost := e.id(t, "us") // no such account
		r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "ghost", transferJSON(a1, ghost, 7))
		var tr api.TransferBody
		r.json(t, &tr)
		e.quiet(t)
		got := e.do(t, "us", "GET", "/v1/transfers/"+tr.ID, keyA, "", "")
		got.json(t, &tr)
		if tr.Status != string(ledger.StatusRefunded) || e.balance(t, "eu", keyA, a1) != before {
			t.Fatalf("got %s, balance %d (was %d), want REFUNDED and the balance restored", tr.Status, e.balance(t, "eu", keyA, a1), before)
		}
	})
	rep, err := postgres.VerifyGlobal(context.Background(), e.c.Stores(), true)
	if err != nil || !rep.OK() {
		t.Fatalf("global verify: %v\n%s", err, rep)
	}
}

// TestConcurrentSameKey: 200 identical POSTs at once with one key make
// exactly one transfer; every answer is the stored response or a 409.
func TestConcurrentSameKey(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	from := e.account(t, "eu", keyA, 10_000)
	to := e.account(t, "us", keyA, 0)
	body := transferJSON(from, to, 42)
	var mu sync.Mutex
	var rs []response
	var wg sync.WaitGroup
	for i := range 200 {
		region := []string{"eu", "us", "ap"}[i%3]
		wg.Go(func() {
			r := e.do(t, region, "POST", "/v1/transfers", keyA, "burst", body)
			mu.Lock()
			rs = append(rs, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	e.quiet(t)
	stored := e.do(t, "eu", "POST", "/v1/transfers", keyA, "burst", body)
	var conflicts int
	for _, r := range rs {
		switch {
		case r.status == http.StatusConflict && r.code(t) == api.CodeIdempotencyKeyInFlight:
			conflicts++
		case r.status == stored.status && bytes.Equal(r.body, stored.body):
		default:
			t.Fatalf("response %d %s is neither the stored one (%d %s) nor 409", r.status, r.body, stored.status, stored.body)
		}
	}
	t.Logf("%d answered with the stored response, %d with 409", len(rs)-conflicts, conflicts)
	if got := e.balance(t, "us", keyA, to); got != 42 {
		t.Fatalf("destination: got %d, want 42 (exactly one transfer)", got)
	}
	var tr api.TransferBody
	stored.json(t, &tr)
	got := e.do(t, "eu", "GET", "/v1/transfers/"+tr.ID, keyA, "", "")
	got.json(t, &tr)
	if len(tr.Steps) != 2 {
		t.Fatalf("change-log legs in the source region: got %d, want 2 (debit, hold)", len(tr.Steps))
	}
}

// TestBOLA: client B can neither read nor debit client A's accounts, nor
// read A's transfers, in any region; the answers are the same as for
// objects that do not exist.
func TestBOLA(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	a := e.account(t, "eu", keyA, 100)
	b := e.account(t, "us", keyB, 0)
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "t1", transferJSON(a, b, 1))
	var tr api.TransferBody
	r.json(t, &tr)
	for _, region := range []string{"eu", "us", "ap"} {
		for _, path := range []string{"/v1/accounts/" + a, "/v1/accounts/" + a + "/entries", "/v1/transfers/" + tr.ID} {
			if r := e.do(t, region, "GET", path, keyB, "", ""); r.status != 404 {
				t.Errorf("B reads %s in %s: %d %s, want 404", path, region, r.status, r.body)
			}
		}
		r := e.do(t, region, "POST", "/v1/transfers", keyB, "steal-"+region, transferJSON(a, b, 50))
		if r.status != 404 || r.code(t) != ledger.CodeAccountNotFound {
			t.Errorf("B debits A's account in %s: %d %s, want 404 account_not_found", region, r.status, r.body)
		}
	}
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, a); got != 99 {
		t.Fatalf("A's balance: got %d, want 99", got)
	}
}

// TestValidationAndLimits: every malformed request is refused with its
// code, and nothing moves; the rate limit answers 429 with Retry-After.
func TestValidationAndLimits(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	a := e.account(t, "eu", keyA, 100)
	b := e.account(t, "eu", keyA, 0)
	body := func(amount string) string {
		return fmt.Sprintf(`{"from":%q,"to":%q,"amount":%s,"currency":"EUR"}`, a, b, amount)
	}
	cases := []struct {
		name, body string
		status     int
		code       ledger.Code
	}{
		{"Zero", body("0"), 422, ledger.CodeInvalidAmount},
		{"Negative", body("-5"), 422, ledger.CodeInvalidAmount},
		{"Fraction", body("1.5"), 422, ledger.CodeInvalidAmount},
		{"Exponent", body("1e2"), 422, ledger.CodeInvalidAmount},
		{"String", body(`"10"`), 422, ledger.CodeInvalidAmount},
		{"OverInt64", body("9223372036854775808"), 422, ledger.CodeInvalidAmount},
		{"UnknownField", strings.Replace(body("1"), "{", `{"memo":"x",`, 1), 400, ledger.CodeInvalidRequest},
		{"RepeatedField", strings.Replace(body("1"), `"amount":1`, `"amount":1,"amount":2`, 1), 400, ledger.CodeInvalidRequest},
		{"NotJSON", "amount=1", 400, ledger.CodeInvalidRequest},
		{"BadCurrency", strings.Replace(body("1"), "EUR", "XYZ", 1), 422, ledger.CodeInvalidCurrency},
		{"CurrencyMismatch", strings.Replace(body("1"), "EUR", "USD", 1), 422, ledger.CodeCurrencyMismatch},
		{"SameAccount", strings.Replace(body("1"), b, a, 1), 422, ledger.CodeSameAccount},
		{"UnknownRegion", strings.Replace(body("1"), b, "mars-0000000000000", 1), 404, ledger.CodeAccountNotFound},
		{"Oversize", `{"from":"` + strings.Repeat("x", api.MaxBodyBytes) + `"}`, 413, api.CodeBodyTooLarge},
	}
	t.Run("KeyWithSlash", func(t *testing.T) {
		r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "order/1", body("1"))
		if r.status != 400 || r.code(t) != ledger.CodeInvalidRequest {
			t.Fatalf("got %d %s, want 400 invalid_request", r.status, r.body)
		}
	})
	t.Run("FloorBeyondTheClientsOverdraft", func(t *testing.T) {
		for _, floor := range []string{"-1", "-9223372036854775808"} {
			r := e.do(t, "eu", "POST", "/v1/accounts", keyA, "", `{"currency":"EUR","floor":`+floor+`}`)
			if r.status != 422 || r.code(t) != ledger.CodeInvalidAmount {
				t.Fatalf("floor %s: got %d %s, want 422 invalid_amount", floor, r.status, r.body)
			}
		}
	})
	t.Run("ContentTypeNotJSON", func(t *testing.T) {
		for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/xml", "garbage;;"} {
			r := e.doWith(t, "eu", "POST", "/v1/transfers", keyA, body("1"), http.Header{"Content-Type": {ct}, "Idempotency-Key": {"ct-" + ct}})
			if r.status != 415 || r.code(t) != api.CodeUnsupportedMediaType {
				t.Fatalf("Content-Type %q: got %d %s, want 415 unsupported_media_type", ct, r.status, r.body)
			}
		}
	})
	t.Run("IdempotencyKeyTwice", func(t *testing.T) {
		r := e.doWith(t, "eu", "POST", "/v1/transfers", keyA, body("1"), http.Header{"Idempotency-Key": {"twice-1", "twice-2"}})
		if r.status != 400 || r.code(t) != ledger.CodeInvalidRequest {
			t.Fatalf("got %d %s, want 400 invalid_request", r.status, r.body)
		}
	})
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, "eu", "POST", "/v1/transfers", keyA, fmt.Sprintf("bad-%d", i), tc.body)
			if r.status != tc.status || r.code(t) != tc.code {
				t.Fatalf("got %d %s, want %d %s", r.status, r.body, tc.status, tc.code)
			}
		})
	}
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, b); got != 0 {
		t.Fatalf("balance after refused requests: got %d, want 0", got)
	}
	t.Run("RateLimited", func(t *testing.T) {
		var limited response
		for range 10 {
			if r := e.do(t, "eu", "GET", "/v1/accounts/"+a, keyC, "", ""); r.status == http.StatusTooManyRequests {
				limited = r
				break
			}
		}
		if limited.status != 429 || limited.header.Get("Retry-After") == "" || limited.code(t) != api.CodeRateLimited {
			t.Fatalf("got %d %s (Retry-After %q), want 429 rate_limited", limited.status, limited.body, limited.header.Get("Retry-After"))
		}
	})
}

// TestKeyExpiry: idempotency keys expire after their retention and are
// cleaned up; a request repeated after that is not applied again (the
// ledger's business key still knows it) and answers with the first
// transfer, without the replay header; another body under the expired key
// is refused 422 and applies nothing.
func TestKeyExpiry(t *testing.T) {
	e := mustEnv(t, time.Second)
	a := e.account(t, "eu", keyA, 100)
	b := e.account(t, "eu", keyA, 0)
	first := e.do(t, "eu", "POST", "/v1/transfers", keyA, "short-lived", transferJSON(a, b, 30))
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	time.Sleep(1500 * time.Millisecond)
	store := e.c.Region("eu").APIStore
	n, err := store.DeleteExpiredKeys(context.Background(), time.Now())
	if err != nil || n != 1 {
		t.Fatalf("cleanup: removed %d (%v), want 1", n, err)
	}
	if _, ok, _ := store.Key(context.Background(), "a", "short-lived"); ok {
		t.Fatal("the expired key is still stored")
	}
	again := e.do(t, "eu", "POST", "/v1/transfers", keyA, "short-lived", transferJSON(a, b, 30))
	var t1, t2 api.TransferBody
	first.json(t, &t1)
	again.json(t, &t2)
	if again.status != http.StatusCreated || t2.ID != t1.ID || again.header.Get(api.HeaderReplayed) != "" {
		t.Fatalf("after expiry: %d %s, want 201 with the first transfer %s", again.status, again.body, t1.ID)
	}
	if loc := again.header.Get("Location"); loc != "/v1/transfers/"+t1.ID {
		t.Fatalf("Location after expiry: %q, want the first transfer's", loc)
	}
	if got := e.balance(t, "eu", keyA, b); got != 30 {
		t.Fatalf("balance: got %d, want 30 (applied once)", got)
	}
	// Another body under the expired key: the key still names its
	// transfer, so the request is refused, never answered 202 and dropped.
	time.Sleep(1500 * time.Millisecond)
	if _, err := store.DeleteExpiredKeys(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	other := e.do(t, "eu", "POST", "/v1/transfers", keyA, "short-lived", transferJSON(a, b, 7))
	wantProblem(t, "another body after expiry", other, http.StatusUnprocessableEntity, ledger.CodeIdempotencyKeyReused)
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, b); got != 30 {
		t.Fatalf("balance after another body: got %d, want 30", got)
	}
}

// TestClientRetriesSafely: the client's answer to a transfer is lost after
// the server got it; the client retries with the same key and gets the
// stored response. One transfer, whatever the network did.
func TestClientRetriesSafely(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	a := e.account(t, "eu", keyA, 100)
	b := e.account(t, "us", keyA, 0)
	proxy, err := faultproxy.New(strings.TrimPrefix(e.c.Region("eu").APIURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.Trap([]byte("POST /v1/transfers"), faultproxy.DropAfter)
	cl := &api.Client{BaseURL: "http://" + proxy.Addr(), APIKey: keyA, HTTP: &http.Client{Transport: apicheck.Transport(t, &http.Transport{DisableKeepAlives: true})}}
	r, err := cl.SendTransfer(context.Background(), api.TransferRequest{From: a, To: b, Amount: 25, Currency: "EUR"}, api.NewIdempotencyKey())
	if err != nil {
		t.Fatal(err)
	}
	if proxy.Fired() != 1 || !r.Replayed {
		t.Fatalf("fault fired %d times, replayed=%v: the lost answer was not retried", proxy.Fired(), r.Replayed)
	}
	e.quiet(t)
	if got := e.balance(t, "us", keyA, b); got != 25 {
		t.Fatalf("destination: got %d, want 25", got)
	}
	if _, err := cl.SendTransfer(context.Background(), api.TransferRequest{From: a, To: b, Amount: 0, Currency: "EUR"}, "k0"); err == nil {
		t.Fatal("an invalid transfer was not refused")
	} else if ae := (*api.Error)(nil); !errors.As(err, &ae) || ae.Problem.Code != ledger.CodeInvalidAmount {
		t.Fatalf("got %v, want invalid_amount", err)
	}
}
