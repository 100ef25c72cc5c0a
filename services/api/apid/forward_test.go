package apid_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"github.com/jackc/pgx/v5/pgxpool"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/testbed/apicheck"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/internal/testbed/syncbuf"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

const (
	acmeKey  = "pm_test_key_acme_0123456789"
	panicKey = "pm_test_key_panic_0123456789"
	// panicClient is the client whose lookup by ID panics (panicky).
	panicClient = "panic"
)

// panicky is the API's store with a bug: looking up panicKey or
// panicClient panics, as a nil map or a bad index in the API's code would.
type panicky struct{ api.Store }

func (p panicky) ClientByKey(ctx context.Context, hash []byte) (api.RegisteredClient, bool, error) {
	if h := sha256.Sum256([]byte(panicKey)); bytes.Equal(hash, h[:]) {
		panic("injected: client lookup by key")
	}
	return p.Store.ClientByKey(ctx, hash)
}

func (p panicky) ClientByID(ctx context.Context, id string) (api.RegisteredClient, bool, error) {
	if id == panicClient {
		panic("injected: client lookup by id")
	}
	return p.Store.ClientByID(ctx, id)
}

// forwardBed is a running eu API (of regions eu and us) whose store is
// panicky, a connection to its NATS server, an account of client acme, and
// the API's log.
type forwardBed struct {
	srv     *apid.Server
	nc      *nats.Conn
	ids     *idgen.Regions
	account string
	log     *syncbuf.Buffer
	pool    *pgxpool.Pool
}

func mustForwardBed(t *testing.T) *forwardBed {
	t.Helper()
	return mustForwardBedReading(t, nil)
}

// mustForwardBedReading is mustForwardBed with the API's forwarded calls
// read through wrap's decorator (apid.Config.WrapForwardReader; nil for
// none).
func mustForwardBedReading(t *testing.T, wrap func(api.ForwardReader) api.ForwardReader) *forwardBed {
	t.Helper()
	ns, nc := natsembed.MustStart(t)
	pool, url := pgtest.MustDatabase(t, postgres.Migrations()...)
	ids, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := &forwardBed{nc: nc, ids: ids, log: &syncbuf.Buffer{}, pool: pool}
	b.srv, err = apid.Open(ctx, apid.Config{Region: "eu", Regions: ids, Node: 3, PostgresURL: url, NATSURL: ns.ClientURL(), Shards: 2,
		MetricsListen: "127.0.0.1:0", WrapStore: func(s api.Store) api.Store { return panicky{s} }, WrapForwardReader: wrap,
		Log: slog.New(slog.NewTextHandler(b.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.srv.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
		_ = b.srv.Close()
	})
	for id, key := range map[string]string{"acme": acmeKey, panicClient: panicKey} {
		if err := b.srv.Store().PutClient(ctx, api.RegisteredClient{ID: id}, key); err != nil {
			t.Fatal(err)
		}
	}
	r := b.http(t, "POST", "/v1/accounts", acmeKey, `{"currency":"EUR"}`)
	var a api.AccountBody
	if r.status != http.StatusCreated || json.Unmarshal(r.body, &a) != nil {
		t.Fatalf("open acme's account: %d %s", r.status, r.body)
	}
	b.account = a.ID
	return b
}

// answer is an API answer, over HTTP or NATS.
type answer struct {
	status  int
	header  map[string]string
	body    []byte
	problem api.Problem
}

// forward sends data to the eu API's forward subject as a peer region
// would, and returns its answer.
func (b *forwardBed) forward(t *testing.T, data string) answer {
	t.Helper()
	msg, err := b.nc.Request(api.ForwardSubject("eu"), []byte(data), 10*time.Second)
	if err != nil {
		t.Fatalf("forwarded call %.80s: %v", data, err)
	}
	var rep struct {
		Status int               `json:"status"`
		Header map[string]string `json:"header"`
		Body   []byte            `json:"body"`
	}
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		t.Fatalf("reply to %.80s: %v (%s)", data, err, msg.Data)
	}
	a := answer{status: rep.Status, header: rep.Header, body: rep.Body}
	if rep.Status >= 400 {
		_ = json.Unmarshal(rep.Body, &a.problem)
	}
	return a
}

// http sends an HTTP request to the API with apiKey.
func (b *forwardBed) http(t *testing.T, method, path, apiKey, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	res, err := apicheck.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(res.Body)
	a := answer{status: res.StatusCode, header: map[string]string{"Content-Type": res.Header.Get("Content-Type")}, body: buf.Bytes()}
	if res.StatusCode >= 400 {
		_ = json.Unmarshal(a.body, &a.problem)
	}
	return a
}

// mustServe shows the API still serves good calls: acme's account, by a
// forwarded call and over HTTP, and a page of its entries.
func (b *forwardBed) mustServe(t *testing.T) {
	t.Helper()
	for _, call := range []string{
		fmt.Sprintf(`{"op":"get_account","client":"acme","id":%q}`, b.account),
		fmt.Sprintf(`{"op":"list_entries","client":"acme","id":%q,"limit":1}`, b.account),
	} {
		if r := b.forward(t, call); r.status != http.StatusOK {
			t.Fatalf("good call %s: %d %s, want 200", call, r.status, r.body)
		}
	}
	if r := b.http(t, "GET", "/v1/accounts/"+b.account, acmeKey, ""); r.status != http.StatusOK {
		t.Fatalf("GET /v1/accounts/%s: %d %s, want 200", b.account, r.status, r.body)
	}
}

// TestForwardedCallsChecked publishes hostile calls straight to a region's
// forward subject, as a buggy or lying peer would: each is answered 4xx
// with its code, counted by reason in /metrics, and the API serves good
// calls afterwards. Before the check, list_entries with limit 0 killed the
// process (an index before the start of the page).
func TestForwardedCallsChecked(t *testing.T) {
	b := mustForwardBed(t)
	us, err := idgen.NewGenerator(b.ids, "us", 5)
	if err != nil {
		t.Fatal(err)
	}
	usID, err := us.NextString()
	if err != nil {
		t.Fatal(err)
	}
	acct := b.account
	get := func(extra string) string {
		return fmt.Sprintf(`{"op":"get_account","client":"acme","id":%q%s}`, acct, extra)
	}
	entries := func(page string) string {
		return fmt.Sprintf(`{"op":"list_entries","client":"acme","id":%q,%s}`, acct, page)
	}
	transfer := func(key string) string {
		return fmt.Sprintf(`{"op":"create_transfer","client":"acme"%s,"body":{"from":%q,"to":%q,"amount":1,"currency":"EUR"}}`, key, acct, usID)
	}
	statement := func(fields string) string {
		return fmt.Sprintf(`{"op":"get_statement","client":"acme","id":%q,%s}`, acct, fields)
	}
	refund := func(target string) string {
		return fmt.Sprintf(`{"op":"create_refund","client":"acme","id":%q,"key":"k1"%s}`, acct, target)
	}
	tests := []struct {
		name   string
		call   string
		status int
		code   ledger.Code
		why    api.Refusal
	}{
		{"MalformedJSON", `{"op":"get_account",`, 400, ledger.CodeInvalidRequest, api.RefusedMalformed},
		{"NotAnObject", `[1,2,3]`, 400, ledger.CodeInvalidRequest, api.RefusedMalformed},
		{"LimitNotAnInt", entries(`"limit":1e30`), 400, ledger.CodeInvalidRequest, api.RefusedMalformed},
		{"UnknownOp", `{"op":"drop_accounts","client":"acme"}`, 400, ledger.CodeInvalidRequest, api.RefusedOp},
		{"NoClient", fmt.Sprintf(`{"op":"get_account","id":%q}`, acct), 400, ledger.CodeInvalidRequest, api.RefusedClient},
		{"BadClient", fmt.Sprintf(`{"op":"get_account","client":"ac/me","id":%q}`, acct), 400, ledger.CodeInvalidRequest, api.RefusedClient},
		{"LongClient", fmt.Sprintf(`{"op":"get_account","client":%q,"id":%q}`, strings.Repeat("c", 65), acct), 400, ledger.CodeInvalidRequest, api.RefusedClient},
		{"NoID", `{"op":"get_account","client":"acme"}`, 400, ledger.CodeInvalidRequest, api.RefusedID},
		{"MalformedID", `{"op":"get_account","client":"acme","id":"eu-0000"}`, 400, ledger.CodeInvalidRequest, api.RefusedID},
		{"IDOfAnotherRegion", fmt.Sprintf(`{"op":"get_account","client":"acme","id":%q}`, usID), 400, ledger.CodeInvalidRequest, api.RefusedID},
		{"IDOnCreate", fmt.Sprintf(`{"op":"create_account","client":"acme","id":%q,"body":{"currency":"EUR"}}`, acct), 400, ledger.CodeInvalidRequest, api.RefusedID},
		{"LimitZero", entries(`"limit":0`), 400, ledger.CodeInvalidRequest, api.RefusedPage},
		{"LimitNegative", entries(`"limit":-1`), 400, ledger.CodeInvalidRequest, api.RefusedPage},
		{"Limit501", entries(`"limit":501`), 400, ledger.CodeInvalidRequest, api.RefusedPage},
		{"LimitHuge", entries(`"limit":9223372036854775807`), 400, ledger.CodeInvalidRequest, api.RefusedPage},
		{"AfterNegative", entries(`"limit":50,"after":-1`), 400, ledger.CodeInvalidRequest, api.RefusedPage},
		{"PageOnGet", get(`,"limit":5`), 400, ledger.CodeInvalidRequest, api.RefusedPage},
		{"BodyOversized", fmt.Sprintf(`{"op":"create_account","client":"acme","body":{"currency":"EUR","pad":%q}}`, strings.Repeat("x", api.MaxBodyBytes)),
			413, api.CodeBodyTooLarge, api.RefusedBody},
		{"BodyMissing", `{"op":"create_account","client":"acme"}`, 400, ledger.CodeInvalidRequest, api.RefusedBody},
		{"BodyOnGet", get(`,"body":{}`), 400, ledger.CodeInvalidRequest, api.RefusedBody},
		{"KeyMissing", transfer(""), 400, api.CodeIdempotencyKeyMissing, api.RefusedKey},
		{"KeyWithSpace", transfer(`,"key":"a b"`), 400, ledger.CodeInvalidRequest, api.RefusedKey},
		{"KeyNotASCII", transfer(`,"key":"ключ"`), 400, ledger.CodeInvalidRequest, api.RefusedKey},
		{"KeyTooLong", transfer(fmt.Sprintf(`,"key":%q`, strings.Repeat("k", 256))), 400, ledger.CodeInvalidRequest, api.RefusedKey},
		{"KeyOnGet", get(`,"key":"k1"`), 400, ledger.CodeInvalidRequest, api.RefusedKey},
		{"TargetMissing", refund(""), 400, ledger.CodeInvalidRequest, api.RefusedTarget},
		{"TargetBadCurrency", refund(fmt.Sprintf(`,"target":{"from":%q,"to":%q,"currency":"euro"}`, acct, acct)), 400, ledger.CodeInvalidRequest, api.RefusedTarget},
		{"TargetMalformedFrom", refund(fmt.Sprintf(`,"target":{"from":"x","to":%q,"currency":"EUR"}`, acct)), 400, ledger.CodeInvalidRequest, api.RefusedTarget},
		{"TargetPayeeElsewhere", refund(fmt.Sprintf(`,"target":{"from":%q,"to":%q,"currency":"EUR"}`, acct, usID)), 400, ledger.CodeInvalidRequest, api.RefusedTarget},
		{"TargetOnGet", get(fmt.Sprintf(`,"target":{"from":%q,"to":%q,"currency":"EUR"}`, acct, acct)), 400, ledger.CodeInvalidRequest, api.RefusedTarget},
		{"RegionOnGet", get(`,"region":"eu"`), 400, ledger.CodeInvalidRequest, api.RefusedRegion},
		{"RegionOnCreateWithoutKey", `{"op":"create_account","client":"acme","region":"eu","body":{"currency":"EUR"}}`, 400, ledger.CodeInvalidRequest, api.RefusedRegion},
		{"KeyedCreateWithoutRegion", `{"op":"create_account","client":"acme","key":"k1","body":{"currency":"EUR"}}`, 400, ledger.CodeInvalidRequest, api.RefusedRegion},
		{"ClaimUnknownRegion", `{"op":"claim_account_key","client":"acme","key":"k1","region":"mars","body":{"currency":"EUR"}}`, 400, ledger.CodeInvalidRequest, api.RefusedRegion},
		{"ClaimWithoutKey", `{"op":"claim_account_key","client":"acme","region":"eu","body":{"currency":"EUR"}}`, 400, api.CodeIdempotencyKeyMissing, api.RefusedKey},
		{"ClaimKeyWithSlash", `{"op":"claim_account_key","client":"acme","key":"a/b","region":"eu","body":{"currency":"EUR"}}`, 400, ledger.CodeInvalidRequest, api.RefusedKey},
		{"ClaimWithoutBody", `{"op":"claim_account_key","client":"acme","key":"k1","region":"eu"}`, 400, ledger.CodeInvalidRequest, api.RefusedBody},
		{"AtInTheFuture", get(`,"at":"2999-01-01T00:00:00Z"`), 400, ledger.CodeInvalidRequest, api.RefusedTime},
		{"AtOnEntries", entries(`"limit":5,"at":"2020-01-01T00:00:00Z"`), 400, ledger.CodeInvalidRequest, api.RefusedTime},
		{"PeriodOnGet", get(`,"from":"2020-01-01T00:00:00Z","to":"2020-02-01T00:00:00Z"`), 400, ledger.CodeInvalidRequest, api.RefusedTime},
		{"StatementNoPeriod", statement(`"limit":5`), 400, ledger.CodeInvalidRequest, api.RefusedTime},
		{"StatementNoTo", statement(`"limit":5,"from":"2020-01-01T00:00:00Z"`), 400, ledger.CodeInvalidRequest, api.RefusedTime},
		{"StatementBackwards", statement(`"limit":5,"from":"2020-02-01T00:00:00Z","to":"2020-01-01T00:00:00Z"`), 400, ledger.CodeInvalidRequest, api.RefusedTime},
		{"StatementToFuture", statement(`"limit":5,"from":"2020-01-01T00:00:00Z","to":"2999-01-01T00:00:00Z"`), 400, ledger.CodeInvalidRequest, api.RefusedTime},
		{"StatementLimitZero", statement(`"limit":0,"from":"2020-01-01T00:00:00Z","to":"2020-02-01T00:00:00Z"`), 400, ledger.CodeInvalidRequest, api.RefusedPage},
		{"AtNotATime", get(`,"at":"yesterday"`), 400, ledger.CodeInvalidRequest, api.RefusedMalformed},
		{"ListOnGet", get(`,"list":{}`), 400, ledger.CodeInvalidRequest, api.RefusedList},
		{"ListMissing", `{"op":"list_transfers","client":"acme","limit":5}`, 400, ledger.CodeInvalidRequest, api.RefusedList},
		{"ListBadStatus", `{"op":"list_transfers","client":"acme","limit":5,"list":{"status":"DONE"}}`, 400, ledger.CodeInvalidRequest, api.RefusedList},
		{"ListBadCurrency", `{"op":"list_accounts","client":"acme","limit":5,"list":{"currency":"euro"}}`, 422, ledger.CodeInvalidCurrency, api.RefusedList},
		{"ListAccountNotAnID", `{"op":"list_transfers","client":"acme","limit":5,"list":{"account":"eu-123"}}`, 400, ledger.CodeInvalidRequest, api.RefusedList},
		{"ListBadCursor", `{"op":"list_transfers","client":"acme","limit":5,"list":{"after":{"created_at":"2026-01-01T00:00:00Z","id":"x"}}}`, 400, ledger.CodeInvalidRequest, api.RefusedList},
		{"ListEmptyPeriod", `{"op":"list_transfers","client":"acme","limit":5,"list":{"created_gte":"2026-01-02T00:00:00Z","created_lt":"2026-01-01T00:00:00Z"}}`, 400, ledger.CodeInvalidRequest, api.RefusedList},
		{"ListLimitZero", `{"op":"list_accounts","client":"acme","limit":0,"list":{}}`, 400, ledger.CodeInvalidRequest, api.RefusedPage},
	}
	want := map[api.Refusal]int64{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.forward(t, tt.call)
			if r.status != tt.status || r.problem.Code != tt.code || r.problem.Detail == "" {
				t.Fatalf("got %d %s, want %d %s with a detail", r.status, r.body, tt.status, tt.code)
			}
			if r.header["Content-Type"] != "application/problem+json" {
				t.Errorf("content type %q, want application/problem+json", r.header["Content-Type"])
			}
		})
		want[tt.why]++
	}
	b.mustServe(t)
	for _, why := range api.Refusals {
		got := scrape.Sum(t, b.srv.MetricsURL(), "paymesh_forwarded_calls_refused_total", map[string]string{"region": "eu", "reason": why.String()})
		if got != want[why] {
			t.Errorf("paymesh_forwarded_calls_refused_total{reason=%q}: got %d, want %d", why, got, want[why])
		}
	}
	if n := scrape.Sum(t, b.srv.MetricsURL(), "paymesh_api_panics_total", nil); n != 0 {
		t.Errorf("paymesh_api_panics_total: got %d, want 0", n)
	}
}

// TestPanicAnswered: a panic while serving a forwarded call, or an HTTP
// request, is answered 500 with the generic internal problem (nothing of
// the panic reaches the caller), logged with its stack and counted by
// site, and the API serves on.
func TestPanicAnswered(t *testing.T) {
	b := mustForwardBed(t)
	internal := func(t *testing.T, r answer) {
		t.Helper()
		if r.status != http.StatusInternalServerError || r.problem.Code != api.CodeInternal || r.header["Content-Type"] != "application/problem+json" {
			t.Fatalf("got %d %v %s, want 500 internal problem", r.status, r.header, r.body)
		}
		if strings.Contains(string(r.body), "injected") {
			t.Fatalf("the answer %s tells the panic", r.body)
		}
	}
	t.Run("Forwarded", func(t *testing.T) {
		internal(t, b.forward(t, fmt.Sprintf(`{"op":"create_account","client":%q,"body":{"currency":"EUR"}}`, panicClient)))
		b.mustServe(t)
	})
	t.Run("HTTP", func(t *testing.T) {
		internal(t, b.http(t, "GET", "/v1/accounts/"+b.account, panicKey, ""))
		b.mustServe(t)
	})
	for _, site := range api.PanicSites {
		if n := scrape.Sum(t, b.srv.MetricsURL(), "paymesh_api_panics_total", map[string]string{"region": "eu", "site": site.String()}); n != 1 {
			t.Errorf("paymesh_api_panics_total{site=%q}: got %d, want 1", site, n)
		}
	}
	logged := b.log.String()
	for _, want := range []string{"injected: client lookup by id", "injected: client lookup by key", "site=forwarded", "site=http", "goroutine "} {
		if !strings.Contains(logged, want) {
			t.Errorf("log has no %q:\n%s", want, logged)
		}
	}
	if n, ok := scrape.One(t, b.srv.MetricsURL(), "paymesh_account_id_collisions_total", map[string]string{"region": "eu"}); !ok || n != 0 {
		t.Errorf("paymesh_account_id_collisions_total: got %v (exported: %v), want 0", n, ok)
	}
}

// auditor decorates the API's ForwardReader as an audit of what peers send
// would: it records each call's operation, client and refusal. With pass
// set it also clears the refusal of a call of an operation the API does
// not serve, as a buggy decorator might.
type auditor struct {
	api.ForwardReader
	pass bool
	mu   sync.Mutex
	seen []string
}

func (a *auditor) ReadForwarded(data []byte) (api.Call, api.Refusal, error) {
	c, why, err := a.ForwardReader.ReadForwarded(data)
	a.mu.Lock()
	defer a.mu.Unlock()
	line := c.Op + " " + c.Client
	if err != nil {
		line += " refused " + why.String()
	}
	a.seen = append(a.seen, line)
	if a.pass && why == api.RefusedOp {
		err = nil
	}
	return c, why, err
}

// TestForwardReaderDecorated: a decorator installed through
// WrapForwardReader sees every forwarded call, decoded, with its refusal,
// and the API answers as without it; a call of no operation here that the
// decorator lets through is still refused (op) and counted.
func TestForwardReaderDecorated(t *testing.T) {
	a := &auditor{pass: true}
	b := mustForwardBedReading(t, func(r api.ForwardReader) api.ForwardReader { a.ForwardReader = r; return a })
	if r := b.forward(t, fmt.Sprintf(`{"op":"get_account","client":"acme","id":%q}`, b.account)); r.status != http.StatusOK {
		t.Fatalf("get_account: %d %s, want 200", r.status, r.body)
	}
	if r := b.forward(t, fmt.Sprintf(`{"op":"list_entries","client":"acme","id":%q}`, b.account)); r.status != http.StatusBadRequest {
		t.Fatalf("list_entries without a limit: %d %s, want 400", r.status, r.body)
	}
	if r := b.forward(t, `{"op":"drop_accounts","client":"acme"}`); r.status != http.StatusBadRequest || r.problem.Code != ledger.CodeInvalidRequest {
		t.Fatalf("an unknown operation let through by the decorator: %d %s, want 400 invalid_request", r.status, r.body)
	}
	a.mu.Lock()
	seen := strings.Join(a.seen, "; ")
	a.mu.Unlock()
	if want := "get_account acme; list_entries acme refused page; drop_accounts acme refused op"; seen != want {
		t.Errorf("the decorator saw %q, want %q", seen, want)
	}
	for why, want := range map[api.Refusal]int64{api.RefusedPage: 1, api.RefusedOp: 1} {
		got := scrape.Sum(t, b.srv.MetricsURL(), "paymesh_forwarded_calls_refused_total", map[string]string{"region": "eu", "reason": why.String()})
		if got != want {
			t.Errorf("paymesh_forwarded_calls_refused_total{reason=%q}: got %d, want %d", why, got, want)
		}
	}
}

// TestWebhookCopiesChecked: a peer's push of an endpoint is checked as any
// input before it is written: an endpoint homed here, a body whose client
// is not the call's, a URL or types a create refuses, a secret that is
// none, no version, an unknown field; a sound one is written, and an older
// version after it changes nothing.
func TestWebhookCopiesChecked(t *testing.T) {
	b := mustForwardBed(t)
	us, err := idgen.NewGenerator(b.ids, "us", 6)
	if err != nil {
		t.Fatal(err)
	}
	usID, _ := us.NextString()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	put := func(id, client, fields string) string {
		return fmt.Sprintf(`{"op":"put_webhook_endpoint","client":"acme","id":%q,"body":{"client":%q,"types":[],"status":"enabled",`+
			`"created_at":"2026-12-01T00:00:00Z","updated_at":"2026-12-01T00:00:00Z",%s}}`, id, client, fields)
	}
	sound := `"url":"https://hooks.example.com/in","secret":"` + secret + `","version":2`
	for _, c := range []struct{ name, call string }{
		{"HomedHere", put(b.account, "acme", sound)},
		{"AnotherClient", put(usID, "other", sound)},
		{"PlainHTTP", put(usID, "acme", `"url":"http://hooks.example.com/in","secret":"`+secret+`","version":2`)},
		{"NotASecret", put(usID, "acme", `"url":"https://hooks.example.com/in","secret":"hunter2","version":2`)},
		{"NoVersion", put(usID, "acme", `"url":"https://hooks.example.com/in","secret":"`+secret+`"`)},
		{"UnknownField", put(usID, "acme", sound+`,"feed_tx":1`)},
		{"BadType", strings.Replace(put(usID, "acme", sound), `"types":[]`, `"types":["x.y"]`, 1)},
		{"BadStatus", strings.Replace(put(usID, "acme", sound), `"enabled"`, `"paused"`, 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if r := b.forward(t, c.call); r.status != http.StatusBadRequest || r.problem.Detail == "" {
				t.Errorf("got %d %s, want 400 with a detail", r.status, r.body)
			}
		})
	}
	if r := b.forward(t, put(usID, "acme", sound)); r.status != http.StatusOK {
		t.Fatalf("a sound copy: %d %s", r.status, r.body)
	}
	older := put(usID, "acme", `"url":"https://old.example.com/in","secret":"`+secret+`","version":1`)
	if r := b.forward(t, older); r.status != http.StatusOK {
		t.Fatalf("an older copy: %d %s", r.status, r.body)
	}
	var (
		url     string
		version int64
	)
	if err := b.pool.QueryRow(t.Context(), `SELECT url, version FROM webhook_endpoints WHERE id = $1`, usID).Scan(&url, &version); err != nil {
		t.Fatal(err)
	}
	if url != "https://hooks.example.com/in" || version != 2 {
		t.Errorf("the copy after an older one: %s version %d, want the sound copy's", url, version)
	}
	if n := 0; b.pool.QueryRow(t.Context(), `SELECT count(*) FROM webhook_endpoints`).Scan(&n) == nil && n != 1 {
		t.Errorf("%d endpoints written, want the sound copy alone", n)
	}
}
