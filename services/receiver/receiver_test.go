package receiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/webhook"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/receiver"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

type bed struct {
	pool *pgxpool.Pool
	recv *receiver.Receiver
	srv  *httptest.Server
}

func newBed(t *testing.T) *bed {
	t.Helper()
	pool, _ := pgtest.MustDatabase(t, receiver.Migrations())
	r, err := receiver.New(receiver.Config{DB: pool, Secrets: []string{secret}, Effects: receiver.Orders{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return &bed{pool: pool, recv: r, srv: srv}
}

// delivery is one post: the event, its attempt hints, and how it is signed.
type delivery struct {
	body []byte
	// sent, if set, is sent in place of the signed body.
	sent                []byte
	id                  string
	at                  time.Time
	secret              string
	attempt, redelivery int
}

func signed(e receiver.Event) delivery {
	body, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	return delivery{body: body, id: e.ID, at: time.Now(), secret: secret, attempt: 1}
}

func (b *bed) post(t *testing.T, d delivery) (int, string) {
	t.Helper()
	sent := d.body
	if d.sent != nil {
		sent = d.sent
	}
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL, bytes.NewReader(sent))
	if d.secret != "" {
		if err := webhook.Sign(req.Header, d.id, d.at, d.body, d.secret); err != nil {
			t.Fatal(err)
		}
	}
	if d.attempt > 0 {
		req.Header.Set(webhook.HeaderAttempt, strconv.Itoa(d.attempt))
	}
	if d.redelivery > 0 {
		req.Header.Set(webhook.HeaderRedelivery, strconv.Itoa(d.redelivery))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, strings.TrimSpace(out.String())
}

func (b *bed) mustPost(t *testing.T, d delivery, want receiver.Outcome) {
	t.Helper()
	code, body := b.post(t, d)
	if code != http.StatusOK || !strings.Contains(body, `"outcome":"`+string(want)+`"`) {
		t.Fatalf("post %s: %d %s, want 200 %s", d.id, code, body, want)
	}
}

func (b *bed) totals(t *testing.T) receiver.Totals {
	t.Helper()
	tot, err := b.recv.Totals(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tot
}

// account builds an account's events in sequence order.
type account struct {
	id  string
	seq int64
}

func (a *account) event(typ ledger.EventType, data api.EventData) receiver.Event {
	a.seq++
	return receiver.Event{ID: api.EventID(a.id, a.seq), Type: string(typ), CreatedAt: time.Now().UTC(), Account: a.id, Sequence: a.seq, Data: data}
}

func (a *account) opened() receiver.Event {
	return a.event(ledger.AccountOpened, api.EventData{Account: &api.EventAccountBody{ID: a.id, Currency: "EUR", CreatedAt: time.Now()}})
}

func (a *account) transfer(typ ledger.EventType, id string, amount int64, refundOf string) receiver.Event {
	return a.event(typ, api.EventData{Transfer: &api.TransferBody{ID: id, From: a.id, To: "eu-acct-shop", Amount: amount, Currency: "EUR",
		Status: "completed", RefundOf: refundOf, CreatedAt: time.Now()}})
}

// TestRefusals: a tampered body, a wrong secret, an old timestamp and a
// missing header are refused 401, and bodies that are not events 400; none
// records or applies anything.
func TestRefusals(t *testing.T) {
	b := newBed(t)
	a := &account{id: "eu-acct-1"}
	good := signed(a.opened())
	other, _ := webhook.NewSecret()
	for name, c := range map[string]struct {
		d    func(delivery) delivery
		want int
	}{
		"tampered body": {func(d delivery) delivery {
			d.sent = bytes.Replace(d.body, []byte(`"EUR"`), []byte(`"USD"`), 1)
			return d
		}, 401},
		"wrong secret":  {func(d delivery) delivery { d.secret = other; return d }, 401},
		"old timestamp": {func(d delivery) delivery { d.at = time.Now().Add(-webhook.Tolerance - time.Minute); return d }, 401},
		"future":        {func(d delivery) delivery { d.at = time.Now().Add(webhook.Tolerance + time.Minute); return d }, 401},
		"unsigned":      {func(d delivery) delivery { d.secret = ""; return d }, 401},
		"another id signed": {func(d delivery) delivery {
			d.id = "eu-acct-1.2"
			return d
		}, 400},
	} {
		t.Run(name, func(t *testing.T) {
			if code, body := b.post(t, c.d(good)); code != c.want {
				t.Errorf("%d %s, want %d", code, body, c.want)
			}
		})
	}
	if got := b.recv.Stats().Refused(receiver.RefusedTimestamp); got != 2 {
		t.Errorf("%d refused for their timestamp, want 2", got)
	}
	if tot := b.totals(t); tot.Applied+tot.Parked+tot.Effects != 0 {
		t.Errorf("refused deliveries left %+v", tot)
	}
	b.mustPost(t, good, receiver.Applied)
}

// TestBadBodies: a signed body that is not an event paymesh sends is
// refused 400, whatever is wrong with it, and nothing is applied.
func TestBadBodies(t *testing.T) {
	b := newBed(t)
	a := &account{id: "eu-acct-1"}
	ev := a.transfer(ledger.TransferCreated, "eu-tr-1", 100, "")
	raw, _ := json.Marshal(ev)
	edit := func(f func(*receiver.Event)) []byte {
		e := ev
		tr := *ev.Data.Transfer
		e.Data.Transfer = &tr
		f(&e)
		out, _ := json.Marshal(e)
		return out
	}
	for name, body := range map[string][]byte{
		"not JSON":          []byte(`{"id":`),
		"two values":        append(append([]byte{}, raw...), raw...),
		"id not account":    edit(func(e *receiver.Event) { e.Account = "eu-acct-2" }),
		"id not sequence":   edit(func(e *receiver.Event) { e.Sequence = 7 }),
		"not an event id":   edit(func(e *receiver.Event) { e.ID, e.Account = "eu-acct-1", "eu-acct-1" }),
		"unknown type":      edit(func(e *receiver.Event) { e.Type = "transfer.teleported" }),
		"no created_at":     edit(func(e *receiver.Event) { e.CreatedAt = time.Time{} }),
		"no transfer":       edit(func(e *receiver.Event) { e.Data.Transfer = nil }),
		"transfer and acct": edit(func(e *receiver.Event) { e.Data.Account = &api.EventAccountBody{ID: "eu-acct-1"} }),
		"account event":     edit(func(e *receiver.Event) { e.Type = string(ledger.AccountOpened) }),
		"endpoint event":    edit(func(e *receiver.Event) { e.Type = string(ledger.WebhookEndpointDisabled) }),
		"endpoint not its": edit(func(e *receiver.Event) {
			e.Type, e.Data.Transfer = string(ledger.WebhookEndpointDisabled), nil
			e.Data.WebhookEndpoint = &api.EventEndpointBody{ID: "eu-other", Status: "disabled"}
		}),
		"transfer and endpoint": edit(func(e *receiver.Event) { e.Data.WebhookEndpoint = &api.EventEndpointBody{ID: "eu-acct-1"} }),
		"negative amount":       edit(func(e *receiver.Event) { e.Data.Transfer.Amount = -5 }),
		"refund of nothing":     edit(func(e *receiver.Event) { e.Type = string(ledger.RefundCompleted) }),
	} {
		t.Run(name, func(t *testing.T) {
			d := delivery{body: body, id: ev.ID, at: time.Now(), secret: secret}
			if code, out := b.post(t, d); code != http.StatusBadRequest {
				t.Errorf("%d %s, want 400", code, out)
			}
		})
	}
	big := delivery{body: bytes.Repeat([]byte(" "), 1<<20+1), id: ev.ID, at: time.Now(), secret: secret}
	if code, _ := b.post(t, big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body past 1 MiB: %d, want 413", code)
	}
	resp, err := http.Get(b.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
		t.Errorf("GET: %d (Allow %q), want 405 with Allow: POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if tot := b.totals(t); tot.Applied+tot.Parked+tot.Effects != 0 {
		t.Errorf("bad bodies left %+v", tot)
	}
}

// TestEndpointEvent: a webhook endpoint's disabled event is recorded once
// and changes no order: the shop's effects are the orders' and accounts'.
func TestEndpointEvent(t *testing.T) {
	b := newBed(t)
	ep := &account{id: "eu-endpoint-1"}
	d := signed(ep.event(ledger.WebhookEndpointDisabled, api.EventData{WebhookEndpoint: &api.EventEndpointBody{ID: ep.id, Status: "disabled",
		DisabledReason: "event eu-acct-1.3 failed for 72h0m0s: answered 503"}}))
	for i := range 2 {
		if code, out := b.post(t, d); code != http.StatusOK {
			t.Fatalf("delivery %d: %d %s, want 200", i+1, code, out)
		}
	}
	if tot := b.totals(t); tot.Applied != 1 || tot.Effects != 0 || tot.Parked != 0 {
		t.Errorf("after an endpoint's event twice: %+v, want it applied once, with no effect", tot)
	}
}

// TestOrderedByAccount: 1,000 events of one account, posted in a random
// order with a tenth of them twice, are applied once each, in sequence
// order: the early ones park until the gap before them fills.
func TestOrderedByAccount(t *testing.T) {
	b := newBed(t)
	a := &account{id: "eu-acct-1"}
	evs := []receiver.Event{a.opened()}
	for i := 0; len(evs) < 1000; i++ {
		id := fmt.Sprintf("eu-tr-%d", i)
		evs = append(evs, a.transfer(ledger.TransferCreated, id, 100, ""))
		if i%3 == 0 {
			evs = append(evs, a.transfer(ledger.TransferRejected, id, 100, ""))
		} else {
			evs = append(evs, a.transfer(ledger.TransferCompleted, id, 100, ""))
		}
		if i%5 == 1 && len(evs) < 999 {
			evs = append(evs, a.transfer(ledger.RefundCompleted, fmt.Sprintf("eu-rf-%d", i), 30, id))
		}
	}
	evs = evs[:1000]
	posts := make([]delivery, 0, 1100)
	for _, e := range evs {
		posts = append(posts, signed(e))
	}
	for i := 0; i < 100; i++ {
		d := posts[i*10]
		d.attempt = 2
		posts = append(posts, d)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(posts), func(i, j int) { posts[i], posts[j] = posts[j], posts[i] })
	for _, d := range posts {
		if code, body := b.post(t, d); code != http.StatusOK {
			t.Fatalf("post %s: %d %s", d.id, code, body)
		}
	}
	tot := b.totals(t)
	dups := int64(0)
	for _, n := range tot.Duplicates {
		dups += n
	}
	if tot.Applied != 1000 || tot.Parked != 0 || tot.Effects != 1000 || dups != 100 {
		t.Fatalf("totals %+v, want 1,000 applied and 1,000 effects, none parked, 100 duplicates", tot)
	}
	if st := b.recv.Stats(); st.Parked.Load() == 0 || st.Released.Load() != st.Parked.Load() {
		t.Errorf("parked %d, released %d: want some parked, all released", st.Parked.Load(), st.Released.Load())
	}
	checkOrders(t, b, evs)
}

// checkOrders compares each order with what applying evs in order gives.
func checkOrders(t *testing.T, b *bed, evs []receiver.Event) {
	t.Helper()
	type order struct {
		status          string
		refunded, count int64
	}
	want := map[string]order{}
	for _, e := range evs {
		tr := e.Data.Transfer
		if tr == nil {
			continue
		}
		switch {
		case tr.RefundOf != "":
			o := want[tr.RefundOf]
			o.refunded, o.status, o.count = o.refunded+tr.Amount, "refunded", o.count+1
			want[tr.RefundOf] = o
		case e.Type == string(ledger.TransferCreated):
			want[tr.ID] = order{status: "awaiting_payment", count: 1}
		default:
			o := want[tr.ID]
			o.status, o.count = map[string]string{"transfer.completed": "paid", "transfer.rejected": "failed"}[e.Type], o.count+1
			want[tr.ID] = o
		}
	}
	rows, _ := b.pool.Query(context.Background(), `SELECT transfer_id, status, refunded, events FROM orders`)
	got := map[string]order{}
	var id string
	var o order
	for rows.Next() {
		if err := rows.Scan(&id, &o.status, &o.refunded, &o.count); err != nil {
			t.Fatal(err)
		}
		got[id] = o
	}
	if len(got) != len(want) {
		t.Fatalf("%d orders, want %d", len(got), len(want))
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("order %s: %+v, want %+v", id, got[id], w)
		}
	}
}

// TestDuplicateCauses: each kind of duplicate is named for its cause, and
// none is applied.
func TestDuplicateCauses(t *testing.T) {
	b := newBed(t)
	a := &account{id: "eu-acct-1"}
	first := signed(a.opened())
	b.mustPost(t, first, receiver.Applied)
	retry := first
	retry.attempt = 3
	b.mustPost(t, retry, receiver.Duplicate)
	redelivered := first
	redelivered.attempt, redelivered.redelivery = 4, 1
	b.mustPost(t, redelivered, receiver.Duplicate)
	retried := redelivered // the redelivery's answer was lost: its retry is a retry
	retried.attempt = 5
	b.mustPost(t, retried, receiver.Duplicate)
	unsaid := first
	unsaid.attempt = 0
	b.mustPost(t, unsaid, receiver.Duplicate)
	a.seq++ // number 2 is missing: 3 parks
	early := signed(a.transfer(ledger.TransferCreated, "eu-tr-1", 10, ""))
	b.mustPost(t, early, receiver.Parked)
	b.mustPost(t, early, receiver.Duplicate)

	st := b.recv.Stats()
	tot := b.totals(t)
	for c, want := range map[receiver.Cause]int64{receiver.CauseRetry: 2, receiver.CauseRedelivery: 1, receiver.CauseUnknown: 1, receiver.CauseParked: 1, receiver.CauseStale: 0} {
		if st.Duplicates(c) != want || tot.Duplicates[c] != want {
			t.Errorf("cause %s: %d counted, %d recorded, want %d", c, st.Duplicates(c), tot.Duplicates[c], want)
		}
	}
	if tot.Applied != 1 || tot.Parked != 1 || tot.Effects != 1 {
		t.Errorf("totals %+v, want 1 applied (1 effect), 1 parked", tot)
	}
}

// TestGapReported: an event parked behind a missing one is reported once
// it has waited past the timeout, and released when the gap fills.
func TestGapReported(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	a := &account{id: "eu-acct-1"}
	b.mustPost(t, signed(a.opened()), receiver.Applied)
	missing := signed(a.transfer(ledger.TransferCreated, "eu-tr-1", 10, ""))
	b.mustPost(t, signed(a.transfer(ledger.TransferCompleted, "eu-tr-1", 10, "")), receiver.Parked)
	b.mustPost(t, signed(a.transfer(ledger.TransferCreated, "eu-tr-2", 10, "")), receiver.Parked)
	if gaps, err := b.recv.Gaps(ctx, time.Hour); err != nil || len(gaps) != 0 {
		t.Fatalf("gaps within the timeout: %+v %v, want none", gaps, err)
	}
	gaps, err := b.recv.Gaps(ctx, 0)
	if err != nil || len(gaps) != 1 || gaps[0].Account != a.id || gaps[0].Next != 2 || gaps[0].Parked != 2 || gaps[0].FirstParked != 3 {
		t.Fatalf("gaps %+v %v, want %s waiting for 2 with 2 parked from 3", gaps, err, a.id)
	}
	b.mustPost(t, missing, receiver.Applied)
	if gaps, err := b.recv.Gaps(ctx, 0); err != nil || len(gaps) != 0 {
		t.Fatalf("gaps after the fill: %+v %v", gaps, err)
	}
	if tot := b.totals(t); tot.Applied != 4 || tot.Parked != 0 || tot.Effects != 4 {
		t.Errorf("totals %+v, want 4 applied", tot)
	}
}

// TestConcurrentDuplicates: one event posted by 8 senders at once is
// applied once; the others wait on the account's lock and find it.
func TestConcurrentDuplicates(t *testing.T) {
	b := newBed(t)
	a := &account{id: "eu-acct-1"}
	d := signed(a.opened())
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() { codes[i], _ = b.post(t, d) })
	}
	wg.Wait()
	for _, c := range codes {
		if c != http.StatusOK {
			t.Fatalf("answers %v, want all 200", codes)
		}
	}
	if tot := b.totals(t); tot.Applied != 1 || tot.Effects != 1 || tot.Duplicates[receiver.CauseUnknown] != 7 {
		t.Errorf("totals %+v, want 1 applied, 7 duplicates of the same attempt", tot)
	}
}

// TestNotCommittedIsRetried: a delivery whose transaction fails is answered
// 503, nothing of it stays, and its retry applies it.
func TestNotCommittedIsRetried(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	a := &account{id: "eu-acct-1"}
	d := signed(a.opened())
	if _, err := b.pool.Exec(ctx, `ALTER TABLE customer_accounts ADD CONSTRAINT no_open CHECK (status <> 'open')`); err != nil {
		t.Fatal(err)
	}
	if code, body := b.post(t, d); code != http.StatusServiceUnavailable {
		t.Fatalf("%d %s, want 503", code, body)
	}
	if tot := b.totals(t); tot.Applied+tot.Parked+tot.Effects != 0 {
		t.Fatalf("a failed delivery left %+v", tot)
	}
	if _, err := b.pool.Exec(ctx, `ALTER TABLE customer_accounts DROP CONSTRAINT no_open`); err != nil {
		t.Fatal(err)
	}
	d.attempt = 2
	b.mustPost(t, d, receiver.Applied)
}
