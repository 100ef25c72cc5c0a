package api_test

import (
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// labels is the JSON members of a reference and metadata (raw JSON), each
// left out when "".
func labels(ref, metadata string) string {
	s := ""
	if ref != "" {
		s += fmt.Sprintf(`,"reference":%q`, ref)
	}
	if metadata != "" {
		s += `,"metadata":` + metadata
	}
	return s
}

// labeledJSON is a transfer request with a reference and metadata.
func labeledJSON(from, to string, amount int64, ref, metadata string) string {
	return strings.TrimSuffix(transferJSON(from, to, amount), "}") + labels(ref, metadata) + "}"
}

// TestReferencesOverHTTP: a transfer's and an account's reference and
// metadata are kept and answered; both are part of the request, so the
// same key with other metadata is 422; a reference used again under
// another key is 409 reference_in_use naming the first, sent to any
// region; the lists select by reference and by metadata[key]; every limit
// is a 400 that names it, and nothing is recorded for it.
func TestReferencesOverHTTP(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	src, dst := e.account(t, "eu", keyA, 1000), e.account(t, "us", keyA, 0)

	md := `{"order":"o-1","shop":"north"}`
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "ref-1", labeledJSON(src, dst, 10, "order-1", md))
	var first api.TransferBody
	r.json(t, &first)
	if r.status != http.StatusAccepted && r.status != http.StatusCreated || first.Reference != "order-1" ||
		!reflect.DeepEqual(first.Metadata, map[string]string{"order": "o-1", "shop": "north"}) {
		t.Fatalf("a transfer with labels: %d %s", r.status, r.body)
	}
	if got := e.transfer(t, "ap", keyA, first.ID); got.Reference != "order-1" || got.Metadata["shop"] != "north" {
		t.Fatalf("the transfer read back: %+v", got)
	}
	r = e.do(t, "us", "POST", "/v1/transfers", keyA, "ref-1", labeledJSON(src, dst, 10, "order-1", `{"order":"o-1","shop":"south"}`))
	wantProblem(t, "the key again with other metadata", r, http.StatusUnprocessableEntity, ledger.CodeIdempotencyKeyReused)
	for _, region := range []string{"eu", "ap"} {
		r = e.do(t, region, "POST", "/v1/transfers", keyA, "ref-2-"+region, labeledJSON(src, dst, 10, "order-1", ""))
		wantExisting(t, "the reference under another key via "+region, r, first.ID)
	}
	// Another client's equal reference is its own.
	b1, b2 := e.account(t, "eu", keyB, 100), e.account(t, "eu", keyB, 0)
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyB, "ref-b", labeledJSON(b1, b2, 5, "order-1", "")); r.status != http.StatusCreated {
		t.Fatalf("client B's order-1: %d %s", r.status, r.body)
	}

	t.Run("Lists", func(t *testing.T) {
		e.quiet(t)
		if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "ref-3", labeledJSON(src, dst, 1, "", `{"shop":"north"}`)); r.status >= 300 && r.status != http.StatusAccepted {
			t.Fatalf("%d %s", r.status, r.body)
		}
		for query, want := range map[string]int{
			"reference=order-1":                        3, // the first and the two refused
			"reference=order-1&status=REJECTED":        2,
			"metadata[shop]=north":                     2,
			"metadata[shop]=north&metadata[order]=o-1": 1,
			"metadata[shop]=south":                     0,
		} {
			if got := e.listAll(t, "us", "/v1/transfers", query, 2, keyA); len(got) != want {
				t.Errorf("GET /v1/transfers?%s: %d transfers %v, want %d", query, len(got), got, want)
			}
		}
	})
	t.Run("Accounts", func(t *testing.T) {
		r, a := e.openAccount(t, "eu", keyA, "wallet-key", `{"currency":"EUR","reference":"wallet-1","metadata":{"customer":"cu-1"}}`)
		if r.status != http.StatusCreated || a.Reference != "wallet-1" || a.Metadata["customer"] != "cu-1" {
			t.Fatalf("an account with labels: %d %s", r.status, r.body)
		}
		if again, b := e.openAccount(t, "ap", keyA, "wallet-key", `{"currency":"EUR","reference":"wallet-1","metadata":{"customer":"cu-1"}}`); again.status != http.StatusCreated || b.ID != a.ID {
			t.Fatalf("the retry: %d %s, want %s", again.status, again.body, a.ID)
		}
		r, _ = e.openAccount(t, "us", keyA, "wallet-key", `{"currency":"EUR","reference":"wallet-1","metadata":{"customer":"cu-2"}}`)
		wantProblem(t, "the key with other metadata", r, http.StatusUnprocessableEntity, ledger.CodeIdempotencyKeyReused)
		r, _ = e.openAccount(t, "eu", keyA, "wallet-key-2", `{"currency":"EUR","reference":"wallet-1"}`)
		wantExisting(t, "the account reference under another key", r, a.ID)
		r, _ = e.openAccount(t, "eu", keyA, "", `{"currency":"EUR","reference":"wallet-1"}`)
		wantExisting(t, "the account reference without a key", r, a.ID)
		if got := e.accountBody(t, "us", keyA, a.ID); got.Reference != "wallet-1" || got.Metadata["customer"] != "cu-1" {
			t.Fatalf("the account read back: %+v", got)
		}
		for query, want := range map[string]int{"metadata[customer]=cu-1": 1, "reference=wallet-1": 1, "metadata[customer]=cu-9": 0} {
			if got := e.listAll(t, "ap", "/v1/accounts", query, 5, keyA); len(got) != want || want == 1 && got[0] != a.ID {
				t.Errorf("GET /v1/accounts?%s: %v, want %d", query, got, want)
			}
		}
	})
	t.Run("ErrLimits", func(t *testing.T) {
		var many []string
		for i := range ledger.MaxMetadataKeys + 1 {
			many = append(many, fmt.Sprintf(`"k%d":"v"`, i))
		}
		for name, tt := range map[string]struct{ ref, md, want string }{
			"too many keys": {"", "{" + strings.Join(many, ",") + "}", "over the limit of 20"},
			"long key":      {"", `{"` + strings.Repeat("k", 41) + `":"v"}`, "1-40 characters"},
			"long value":    {"", `{"k":"` + strings.Repeat("v", 501) + `"}`, "over the limit of 500"},
			"number value":  {"", `{"k":1}`, "malformed JSON"},
			"key twice":     {"", `{"k":"a","k":"b"}`, "malformed JSON"},
			"empty object":  {"", `{}`, "empty object"},
			"long ref":      {strings.Repeat("r", 129), "", "1-128 characters"},
			"ref space":     {"order 9", "", "or a space"},
		} {
			body := labeledJSON(src, dst, 1, tt.ref, tt.md)
			r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "limit-"+strings.ReplaceAll(name, " ", "-"), body)
			wantProblem(t, name, r, http.StatusBadRequest, ledger.CodeInvalidRequest)
			if !strings.Contains(string(r.body), tt.want) {
				t.Errorf("%s: %s, want it to name %q", name, r.body, tt.want)
			}
			r, _ = e.openAccount(t, "eu", keyA, "", `{"currency":"EUR"`+labels(tt.ref, tt.md)+"}")
			wantProblem(t, name+" (account)", r, http.StatusBadRequest, ledger.CodeInvalidRequest)
		}
		for _, q := range []string{"metadata[a%20b]=v", "metadata[k]=", "reference=" + url.QueryEscape("a b"), "metadata=x"} {
			r := e.do(t, "eu", "GET", "/v1/transfers?"+q, keyA, "", "")
			wantProblem(t, "GET /v1/transfers?"+q, r, http.StatusBadRequest, ledger.CodeInvalidRequest)
		}
		r := e.do(t, "eu", "GET", "/v1/transfers?reference=limit-x", keyA, "", "")
		if r.status != http.StatusOK || strings.Contains(string(r.body), `"id"`) {
			t.Fatalf("a refused request recorded a transfer: %d %s", r.status, r.body)
		}
	})
}

// wantExisting fails unless r is 409 reference_in_use naming existing.
func wantExisting(tb testing.TB, what string, r response, existing string) {
	tb.Helper()
	wantProblem(tb, what, r, http.StatusConflict, ledger.CodeReferenceInUse)
	var p api.Problem
	r.json(tb, &p)
	if p.Existing != existing || !strings.Contains(p.Detail, existing) {
		tb.Fatalf("%s: %s, want it to name %s", what, r.body, existing)
	}
}

// TestReferenceUnderConcurrency sends 200 transfers at once with one
// reference and 200 keys, from 8 accounts (so from several shards of the
// ledger), to all three regions: exactly one transfer is made, and every
// other answer is 409 naming it.
func TestReferenceUnderConcurrency(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	var srcs []string
	for range 8 {
		srcs = append(srcs, e.account(t, "eu", keyA, 100))
	}
	dst := e.account(t, "eu", keyA, 0)
	const n = 200
	res := make([]response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			region := []string{"eu", "us", "ap"}[i%3]
			res[i] = e.do(t, region, "POST", "/v1/transfers", keyA, fmt.Sprintf("race-%d", i), labeledJSON(srcs[i%len(srcs)], dst, 7, "order-race", ""))
		})
	}
	close(start)
	wg.Wait()
	var winner string
	for i, r := range res {
		if r.status == http.StatusCreated {
			var tr api.TransferBody
			r.json(t, &tr)
			if winner != "" {
				t.Fatalf("two transfers made with one reference: %s and %s (answer %d)", winner, tr.ID, i)
			}
			winner = tr.ID
		}
	}
	if winner == "" {
		t.Fatal("no transfer was made")
	}
	for i, r := range res {
		if r.status != http.StatusCreated {
			wantExisting(t, fmt.Sprintf("answer %d", i), r, winner)
		}
	}
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, dst); got != 7 {
		t.Fatalf("the destination holds %d, want 7: one transfer", got)
	}
	if got := e.listAll(t, "us", "/v1/transfers", "reference=order-race&status=COMPLETED", 50, keyA); len(got) != 1 || got[0] != winner {
		t.Fatalf("completed transfers with the reference: %v, want [%s]", got, winner)
	}
}
