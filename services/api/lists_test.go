package api_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// listAll pages through a list with the given query and page size, from
// region, and returns the IDs in the order given, calling between (when
// set) after each page; it fails on a page that is not newest first.
func (e *env) listAll(tb testing.TB, region, path, query string, limit int, apiKey string, between ...func()) []string {
	tb.Helper()
	var ids []string
	var last struct {
		at time.Time
		id string
	}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			tb.Fatal("more than 1000 pages")
		}
		q, _ := url.ParseQuery(query)
		q.Set("limit", itoaInt(limit))
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		r := e.do(tb, region, "GET", path+"?"+q.Encode(), apiKey, "", "")
		if r.status != http.StatusOK {
			tb.Fatalf("GET %s?%s via %s: %d %s", path, q.Encode(), region, r.status, r.body)
		}
		var items []struct {
			ID        string    `json:"id"`
			CreatedAt time.Time `json:"created_at"`
		}
		var page struct {
			Transfers, Accounts json.RawMessage
			NextCursor          string `json:"next_cursor"`
		}
		r.json(tb, &page)
		raw := page.Transfers
		if raw == nil {
			raw = page.Accounts
		}
		if err := json.Unmarshal(raw, &items); err != nil {
			tb.Fatal(err)
		}
		if len(items) > limit {
			tb.Fatalf("a page of %d items, limit %d", len(items), limit)
		}
		for _, it := range items {
			if last.id != "" && (it.CreatedAt.After(last.at) || it.CreatedAt.Equal(last.at) && it.ID >= last.id) {
				tb.Fatalf("%s (%s) after %s (%s): not newest first", it.ID, it.CreatedAt, last.id, last.at)
			}
			last.at, last.id = it.CreatedAt, it.ID
			ids = append(ids, it.ID)
		}
		if page.NextCursor == "" {
			return ids
		}
		for _, f := range between {
			f()
		}
		cursor = page.NextCursor
	}
}

func itoaInt(n int) string { return strconv.Itoa(n) }

// TestListTransfersAndAccounts: a client's transfers and accounts in three
// regions are listed from any region, newest first, each once, in pages of
// any size; paging while transfers keep arriving skips and repeats
// nothing that was there before; the filters narrow the list as SQL on
// each region's database says; another client sees none of them; bad
// queries and cursors are 400.
func TestListTransfersAndAccounts(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	regions := []string{"eu", "us", "ap"}
	src := map[string]string{}
	for _, r := range regions {
		src[r] = e.account(t, r, keyA, 100000)
	}
	dst := e.account(t, "us", keyA, 0)
	var made []string
	n := 0
	send := func(region, from, to string, amount int64) string {
		n++
		return e.sendTransfer(t, region, "list-"+itoaInt(n), from, to, amount)
	}
	for i := range 7 {
		for _, r := range regions {
			made = append(made, send(r, src[r], dst, int64(i+1)))
		}
	}
	e.quiet(t)
	slices.Sort(made)

	for _, region := range regions {
		for _, limit := range []int{1, 4, 100} {
			got := e.listAll(t, region, "/v1/transfers", "", limit, keyA)
			sorted := slices.Clone(got)
			slices.Sort(sorted)
			if !slices.Equal(sorted, made) {
				t.Fatalf("transfers via %s in pages of %d: %d listed, want the %d made, each once", region, limit, len(got), len(made))
			}
		}
	}
	if got := e.listAll(t, "ap", "/v1/transfers", "", 5, keyB); len(got) != 0 {
		t.Fatalf("client B lists %d of A's transfers", len(got))
	}

	t.Run("Filters", func(t *testing.T) {
		count := func(region, where string, args ...any) int {
			var c int
			if err := e.c.Region(region).Ledger.Store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM transfers WHERE client_id = 'a' AND type = 'transfer' AND `+where, args...).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		}
		if got, want := len(e.listAll(t, "eu", "/v1/transfers", "account="+src["us"], 3, keyA)), count("us", "from_account = $1", src["us"]); got != want || got == 0 {
			t.Fatalf("account=%s: %d, want %d", src["us"], got, want)
		}
		// Into an account: the transfers of every region that paid it.
		into := 0
		for _, r := range regions {
			into += count(r, "to_account = $1", dst)
		}
		if got := len(e.listAll(t, "ap", "/v1/transfers", "account="+dst, 7, keyA)); got != into || into != len(made) {
			t.Fatalf("account=%s (paid from three regions): %d listed, want %d", dst, got, into)
		}
		all := 0
		for _, r := range regions {
			all += count(r, "status = 'COMPLETED'")
		}
		if got := len(e.listAll(t, "us", "/v1/transfers", "status=COMPLETED", 6, keyA)); got != all {
			t.Fatalf("status=COMPLETED: %d, want %d", got, all)
		}
		mid := time.Now().UTC()
		later := send("eu", src["eu"], dst, 1)
		e.quiet(t)
		if got := e.listAll(t, "ap", "/v1/transfers", "created_gte="+url.QueryEscape(mid.Format(time.RFC3339Nano)), 2, keyA); !slices.Equal(got, []string{later}) {
			t.Fatalf("created_gte=%s: %v, want only %s", mid, got, later)
		}
		if got := e.listAll(t, "ap", "/v1/transfers", "created_lt="+url.QueryEscape(mid.Format(time.RFC3339Nano)), 50, keyA); len(got) != len(made) {
			t.Fatalf("created_lt: %d, want %d", len(got), len(made))
		}
		made = append(made, later)
		slices.Sort(made)
	})

	t.Run("PagingWhileArriving", func(t *testing.T) {
		before := slices.Clone(made)
		var arrived []string
		i := 0
		// After every page, a transfer in each region: between the pages,
		// and on both sides of the cursor's time.
		got := e.listAll(t, "eu", "/v1/transfers", "", 2, keyA, func() {
			for _, r := range regions {
				i++
				arrived = append(arrived, send(r, src[r], dst, 1))
			}
		})
		seen := map[string]int{}
		for _, id := range got {
			seen[id]++
		}
		for id, c := range seen {
			if c > 1 {
				t.Fatalf("%s listed %d times", id, c)
			}
		}
		for _, id := range before {
			if seen[id] != 1 {
				t.Fatalf("%s, made before the paging began, listed %d times", id, seen[id])
			}
		}
		for _, id := range arrived {
			if seen[id] != 0 {
				t.Fatalf("%s, made after the paging began, is in a later page (newest first: it sorts above the first)", id)
			}
		}
		if len(got) != len(before) || len(arrived) < len(before) {
			t.Fatalf("%d listed, %d made before, %d arrived while paging", len(got), len(before), len(arrived))
		}
		made = append(made, arrived...)
		slices.Sort(made)
	})

	t.Run("Accounts", func(t *testing.T) {
		want := []string{dst}
		for _, r := range regions {
			want = append(want, src[r])
		}
		gbp := e.do(t, "ap", "POST", "/v1/accounts", keyA, "", `{"currency":"GBP"}`)
		var g api.AccountBody
		gbp.json(t, &g)
		want = append(want, g.ID)
		slices.Sort(want)
		for _, limit := range []int{1, 2, 50} {
			got := e.listAll(t, "us", "/v1/accounts", "", limit, keyA)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("accounts in pages of %d: %v, want %v", limit, got, want)
			}
		}
		if got := e.listAll(t, "eu", "/v1/accounts", "currency=GBP", 10, keyA); !slices.Equal(got, []string{g.ID}) {
			t.Fatalf("currency=GBP: %v, want %s", got, g.ID)
		}
	})

	t.Run("ErrBadQuery", func(t *testing.T) {
		tampered := base64.RawURLEncoding.EncodeToString([]byte("2026-01-01T00:00:00Z|not-an-id"))
		for name, path := range map[string]string{
			"UnknownParameter":    "/v1/transfers?stauts=COMPLETED",
			"BadStatus":           "/v1/transfers?status=DONE",
			"BadAccount":          "/v1/transfers?account=eu-123",
			"BadTime":             "/v1/transfers?created_gte=yesterday",
			"EmptyPeriod":         "/v1/transfers?created_gte=2026-01-02T00:00:00Z&created_lt=2026-01-01T00:00:00Z",
			"LimitZero":           "/v1/transfers?limit=0",
			"Limit501":            "/v1/accounts?limit=501",
			"CursorGarbage":       "/v1/transfers?cursor=%%%",
			"CursorNotBase64":     "/v1/accounts?cursor=not*base64",
			"CursorTampered":      "/v1/transfers?cursor=" + tampered,
			"TwiceStatus":         "/v1/transfers?status=HELD&status=COMPLETED",
			"CurrencyOnTransfers": "/v1/transfers?currency=EUR",
		} {
			r := e.do(t, "us", "GET", path, keyA, "", "")
			if r.status != http.StatusBadRequest || r.code(t) != ledger.CodeInvalidRequest || !strings.Contains(string(r.body), "detail") {
				t.Errorf("%s: %d %s, want 400 invalid_request", name, r.status, r.body)
			}
		}
		r := e.do(t, "us", "GET", "/v1/accounts?currency=euro", keyA, "", "")
		wantProblem(t, "BadCurrency", r, http.StatusUnprocessableEntity, ledger.CodeInvalidCurrency)
	})
}
