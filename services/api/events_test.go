package api_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
)

// feed reads the client's event feed from region, a page of limit at a
// time, starting at cursor, until a page says there is no more; it returns
// the events and the cursor to follow the feed with.
func (e *env) feed(tb testing.TB, region, apiKey, query, cursor string, limit int) ([]api.EventBody, string) {
	tb.Helper()
	var all []api.EventBody
	for pages := 0; ; pages++ {
		if pages > 1000 {
			tb.Fatal("more than 1000 pages")
		}
		q, _ := url.ParseQuery(query)
		q.Set("limit", itoaInt(limit))
		if cursor != "" {
			q.Set("after", cursor)
		}
		r := e.do(tb, region, "GET", "/v1/events?"+q.Encode(), apiKey, "", "")
		if r.status != http.StatusOK {
			tb.Fatalf("GET /v1/events?%s via %s: %d %s", q.Encode(), region, r.status, r.body)
		}
		var page api.EventList
		r.json(tb, &page)
		if len(page.Events) > limit || page.NextCursor == "" {
			tb.Fatalf("a page of %d events (limit %d), next cursor %q", len(page.Events), limit, page.NextCursor)
		}
		all, cursor = append(all, page.Events...), page.NextCursor
		if !page.HasMore {
			return all, cursor
		}
	}
}

// sendTransfer sends a transfer of client A under key through region and
// returns its ID.
func (e *env) sendTransfer(tb testing.TB, region, key, from, to string, amount int64) string {
	tb.Helper()
	r := e.do(tb, region, "POST", "/v1/transfers", keyA, key, transferJSON(from, to, amount))
	var tr api.TransferBody
	r.json(tb, &tr)
	if tr.ID == "" {
		tb.Fatalf("transfer: %d %s", r.status, r.body)
	}
	return tr.ID
}

// TestEventFeed reads a client's events through the API of each region:
// every event the three regions recorded for the client, each once, in
// pages of any size, with its object; followed with the last cursor, only
// what came since; filtered by type; another client's feed is empty; and
// every malformed or made-up query is a 400.
func TestEventFeed(t *testing.T) {
	e := mustEnv(t, 24*time.Hour)
	regions := []string{"eu", "us", "ap"}
	src := map[string]string{}
	for _, r := range regions {
		src[r] = e.account(t, r, keyA, 1000)
	}
	dst := e.account(t, "us", keyA, 0)
	n := 0
	send := func(region, from, to string, amount int64) string {
		n++
		return e.sendTransfer(t, region, "feed-"+itoaInt(n), from, to, amount)
	}
	for i := range 3 {
		for _, r := range regions {
			send(r, src[r], dst, int64(i+1))
		}
	}
	e.quiet(t)
	recorded := 0
	for _, r := range regions {
		var c int
		if err := e.c.Region(r).Ledger.Store.Pool().QueryRow(t.Context(), `SELECT count(*) FROM events WHERE client_id = 'a'`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		recorded += c
	}
	// 4 accounts opened; 3 fundings by the operator (the funded
	// account's owner sees them) and 9 transfers: created and completed.
	if recorded != 4+2*3+2*9 {
		t.Fatalf("%d events recorded for the client, want 28", recorded)
	}
	// The feed shows a commit once no older write transaction of its
	// database is running: wait for all of them.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if got, _ := e.feed(t, "eu", keyA, "", "", 100); len(got) == recorded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the feed does not show the %d events recorded after a minute", recorded)
		}
	}
	var cursor string
	for _, region := range regions {
		for _, limit := range []int{1, 5, 100} {
			got, next := e.feed(t, region, keyA, "", "", limit)
			if len(got) != recorded {
				t.Fatalf("the feed via %s in pages of %d: %d events, want the %d recorded", region, limit, len(got), recorded)
			}
			seqs := map[string][]int64{}
			for _, ev := range got {
				seqs[ev.Account] = append(seqs[ev.Account], ev.Sequence)
				if ev.ID != api.EventID(ev.Account, ev.Sequence) {
					t.Fatalf("event %s of account %s, sequence %d", ev.ID, ev.Account, ev.Sequence)
				}
				if strings.HasPrefix(ev.Type, "transfer.") && (ev.Data.Transfer == nil || ev.Data.Transfer.To != dst && ev.Data.Transfer.To != ev.Account) {
					t.Fatalf("%s %s: its transfer %+v, want one to %s or a funding", ev.Type, ev.ID, ev.Data.Transfer, dst)
				}
			}
			for account, s := range seqs {
				slices.Sort(s)
				for i, q := range s {
					if q != int64(i+1) {
						t.Fatalf("account %s: sequences %v, want each of 1..%d once", account, s, len(s))
					}
				}
			}
			cursor = next
		}
	}

	// Following the feed: only what came since the last cursor.
	later := send("eu", src["eu"], dst, 1)
	e.quiet(t)
	var got []api.EventBody
	for deadline := time.Now().Add(time.Minute); len(got) < 2 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got, _ = e.feed(t, "ap", keyA, "", cursor, 10)
	}
	if len(got) != 2 || got[0].Type != "transfer.created" || got[1].Type != "transfer.completed" || got[1].Data.Transfer.ID != later {
		t.Fatalf("the feed after its last cursor: %+v, want the new transfer's created and completed", got)
	}
	opened, _ := e.feed(t, "us", keyA, "type=account.opened,account.frozen", "", 2)
	if len(opened) != 4 || opened[0].Data.Account == nil || opened[0].Data.Account.Currency != "EUR" {
		t.Fatalf("type=account.opened: %+v, want the 4 accounts opened", opened)
	}
	if other, _ := e.feed(t, "eu", keyB, "", "", 10); len(other) != 0 {
		t.Fatalf("client B's feed holds %d of A's events", len(other))
	}

	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, q := range []string{
		"after=not-a-cursor",
		"after=" + b64(`[1,2]`),
		"after=" + b64(`{"mars":{"tx":5,"account":"`+src["eu"]+`","seq":1}}`),
		"after=" + b64(`{"us":{"tx":5,"account":"`+src["eu"]+`","seq":1}}`), // eu's account under us
		"after=" + b64(`{"eu":{"tx":5,"account":"nope","seq":1}}`),
		"after=" + b64(`{"eu":{"tx":5,"account":"`+src["eu"]+`","seq":0}}`),
		"after=" + b64(`{"eu":{"tx":0,"account":"`+src["eu"]+`","seq":3}}`),
		"type=transfer.teleported",
		"type=transfer.created,transfer.created",
		"type=",
		"limit=0",
		"limit=501",
		"cursor=x",
		"type=account.opened&type=account.closed",
	} {
		if r := e.do(t, "eu", "GET", "/v1/events?"+q, keyA, "", ""); r.status != http.StatusBadRequest {
			t.Fatalf("GET /v1/events?%s: %d %s, want 400", q, r.status, r.body)
		}
	}
}
