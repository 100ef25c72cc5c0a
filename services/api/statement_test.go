package api_test

import (
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestBalanceAsOfAndStatement: an account's balance as of an instant and
// its statement over a period, asked in any region, equal the fold of its
// change-log computed in SQL on the home region's database; a statement
// read a page at a time joins into the whole; bad instants and periods are
// 400, another client's account is 404.
func TestBalanceAsOfAndStatement(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	a := e.account(t, "eu", keyA, 1000)
	b := e.account(t, "eu", keyA, 0)
	instants := []time.Time{time.Now().UTC()}
	var holdID string
	for i := range 4 {
		for j := range 3 {
			key := "stmt-" + string(rune('a'+i)) + string(rune('a'+j))
			if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, key, transferJSON(a, b, int64(10*i+j+1))); r.status != http.StatusCreated {
				t.Fatalf("transfer: %d %s", r.status, r.body)
			}
		}
		// A hold of 7 from a, open over rounds 1 and 2: held and available
		// at an instant count it.
		switch i {
		case 1:
			if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "stmt-hold", holdJSON(a, b, 7, "")); r.status != http.StatusCreated {
				t.Fatalf("hold: %d %s", r.status, r.body)
			} else {
				var h api.TransferBody
				r.json(t, &h)
				holdID = h.ID
			}
		case 3:
			if r := e.do(t, "eu", "POST", "/v1/transfers/"+holdID+"/void", keyA, "stmt-void", ""); r.status != http.StatusOK {
				t.Fatalf("void: %d %s", r.status, r.body)
			}
		}
		time.Sleep(5 * time.Millisecond)
		instants = append(instants, time.Now().UTC())
	}
	heldAt := func(n int) int64 { // the hold was made in round 1, voided in round 3
		if n >= 2 && n <= 3 {
			return 7
		}
		return 0
	}
	pool := e.c.Region("eu").Ledger.Store.Pool()
	fold := func(acct string, at time.Time, op string) int64 {
		var n int64
		if err := pool.QueryRow(t.Context(), `SELECT coalesce(sum(amount), 0) FROM postings WHERE account_id = $1 AND created_at `+op+` $2`, acct, at).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, region := range []string{"eu", "us"} {
		for n, at := range instants {
			r := e.do(t, region, "GET", "/v1/accounts/"+a+"?as_of="+url.QueryEscape(at.Format(time.RFC3339Nano)), keyA, "", "")
			var got api.AccountAsOfBody
			r.json(t, &got)
			bal := fold(a, at, "<=")
			if r.status != http.StatusOK || got.Balance != bal || got.ID != a || !got.AsOf.Equal(at) || got.Held != heldAt(n) || got.Available != bal-heldAt(n) {
				t.Fatalf("as of %s via %s: %d %s, want the fold %d, held %d", at.Format(time.StampMicro), region, r.status, r.body, bal, heldAt(n))
			}
		}
		from, to := instants[1], instants[len(instants)-1]
		path := "/v1/accounts/" + b + "/statement?from=" + url.QueryEscape(from.Format(time.RFC3339Nano)) + "&to=" + url.QueryEscape(to.Format(time.RFC3339Nano))
		var whole api.StatementBody
		r := e.do(t, region, "GET", path, keyA, "", "")
		r.json(t, &whole)
		if r.status != http.StatusOK || whole.OpeningBalance != fold(b, from, "<") || whole.ClosingBalance != fold(b, to, "<") || len(whole.Entries) != 9 {
			t.Fatalf("statement via %s: %d %s, want opening %d closing %d and 9 entries", region, r.status, r.body, fold(b, from, "<"), fold(b, to, "<"))
		}
		running := whole.OpeningBalance
		for _, en := range whole.Entries {
			running += en.Amount
			if en.BalanceAfter != running || en.CreatedAt.Before(from) || !en.CreatedAt.Before(to) {
				t.Fatalf("statement entry %+v: want balance_after %d, written in the period", en, running)
			}
		}
		if running != whole.ClosingBalance {
			t.Fatalf("opening %d plus the entries is %d, closing %d", whole.OpeningBalance, running, whole.ClosingBalance)
		}
		var paged []api.EntryBody
		for after := int64(-1); ; {
			p := path + "&limit=4"
			if after >= 0 {
				p += "&after=" + strconv.FormatInt(after, 10)
			}
			var page api.StatementBody
			r := e.do(t, region, "GET", p, keyA, "", "")
			r.json(t, &page)
			if r.status != http.StatusOK || page.OpeningBalance != whole.OpeningBalance || page.ClosingBalance != whole.ClosingBalance {
				t.Fatalf("page after %d: %d %s", after, r.status, r.body)
			}
			paged = append(paged, page.Entries...)
			if page.NextAfter == nil {
				break
			}
			after = *page.NextAfter
		}
		if len(paged) != len(whole.Entries) {
			t.Fatalf("%d entries in pages of 4, %d in one", len(paged), len(whole.Entries))
		}
	}

	future := url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))
	past := url.QueryEscape(instants[0].Format(time.RFC3339Nano))
	for name, path := range map[string]string{
		"AsOfGarbage":         "/v1/accounts/" + a + "?as_of=yesterday",
		"AsOfFuture":          "/v1/accounts/" + a + "?as_of=" + future,
		"StatementNoFrom":     "/v1/accounts/" + a + "/statement",
		"StatementFromFuture": "/v1/accounts/" + a + "/statement?from=" + future,
		"StatementToFuture":   "/v1/accounts/" + a + "/statement?from=" + past + "&to=" + future,
		"StatementEmpty":      "/v1/accounts/" + a + "/statement?from=" + past + "&to=" + past,
		"StatementBadLimit":   "/v1/accounts/" + a + "/statement?from=" + past + "&limit=0",
		"StatementBadAfter":   "/v1/accounts/" + a + "/statement?from=" + past + "&after=-1",
		"AsOfYearZero":        "/v1/accounts/" + a + "?as_of=" + url.QueryEscape("0000-01-01T00:00:00+01:00"),
		"FromYearZero":        "/v1/accounts/" + a + "/statement?from=" + url.QueryEscape("0000-01-01T00:00:00+01:00"),
	} {
		r := e.do(t, "us", "GET", path, keyA, "", "")
		wantProblem(t, name, r, http.StatusBadRequest, ledger.CodeInvalidRequest)
	}
	for name, path := range map[string]string{
		"AsOfOtherClient":      "/v1/accounts/" + a + "?as_of=" + past,
		"StatementOtherClient": "/v1/accounts/" + a + "/statement?from=" + past,
	} {
		r := e.do(t, "ap", "GET", path, keyB, "", "")
		wantProblem(t, name, r, http.StatusNotFound, ledger.CodeAccountNotFound)
	}
}
