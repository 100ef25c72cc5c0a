package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// Purposes of scenario 11's ops.
const (
	// PurposeHostile marks a hostile request through the API: malformed,
	// unauthenticated, or aimed at another client's accounts (BOLA). The
	// API must refuse it, so it is recorded as failed whatever the answer:
	// I3 then requires that it has no effect.
	PurposeHostile = "hostile"
	// PurposeOtherClient marks a legitimate transfer of the second API
	// client, between its own accounts (the transfers BOLA reads aim at).
	PurposeOtherClient = "other-client"
)

// otherClientID is scenario 11's second API client: it owns accounts in
// every region, which the workload's client must not be able to touch.
const otherClientID = "chaos-other"

// hostileReq is one hostile request.
type hostileReq struct {
	what         string // the case
	method, path string
	header       http.Header
	body         []byte
	client       string // whose API key it carries (for the history)
	rec          Body   // what it asks for, as far as it says (for the history)
	via          string
}

// hostility is scenario 11's state: the second client's key, accounts and
// transfers, and what the hostile requests got back.
type hostility struct {
	otherKey string
	accts    map[string][]string // region -> the second client's accounts
	system   map[string]string   // region -> a system account
	transit  map[string]string   // region -> its transit account (EUR)
	xfers    []string            // the second client's transfers
	sent     atomic.Int64
	refused  atomic.Int64
	mu       sync.Mutex
	wrong    []string // the requests that were not refused
	statuses map[int]int
}

// setup registers the second client in every region, opens and funds two
// accounts for it per region, and makes one transfer between them per
// region through the API with its own key.
func (h *hostility) setup(ctx context.Context, e *env) error {
	h.otherKey = newAPIKey("pm_chaos_other_")
	h.accts, h.system, h.transit, h.xfers, h.wrong, h.statuses = map[string][]string{}, map[string]string{}, map[string]string{}, nil, nil, map[int]int{}
	for _, n := range e.names {
		store := e.c.Region(n).Ledger.Store
		if err := e.c.Region(n).APIStore.PutClient(ctx, api.RegisteredClient{ID: otherClientID, Name: "chaos other", RatePerSec: 1_000_000}, h.otherKey); err != nil {
			return err
		}
		var sys string
		if err := store.Pool().QueryRow(ctx, `SELECT id FROM accounts WHERE kind <> 'customer' ORDER BY id LIMIT 1`).Scan(&sys); err != nil {
			return fmt.Errorf("a system account of %s: %w", n, err)
		}
		h.system[n] = sys
		if err := store.Pool().QueryRow(ctx, `SELECT id FROM accounts WHERE kind = 'transit' AND currency = 'EUR'`).Scan(&sys); err != nil {
			return fmt.Errorf("the transit account of %s: %w", n, err)
		}
		h.transit[n] = sys
		for range 2 {
			id, err := e.fundedAccount(ctx, n, otherClientID)
			if err != nil {
				return err
			}
			h.accts[n] = append(h.accts[n], id)
		}
	}
	// The funding must have landed: a BOLA transfer then fails only for
	// want of ownership, not of money.
	for _, n := range e.names {
		for _, id := range h.accts[n] {
			for deadline := time.Now().Add(10 * time.Second); ; {
				a, err := e.c.Region(n).Ledger.Store.Account(ctx, id)
				if err == nil && a.Balance == funding {
					break
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("funding of %s not applied", id)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	for _, n := range e.names {
		key := fmt.Sprintf("s%d-other-%s", e.seed, n)
		b := Body{Type: ledger.TypeTransfer, From: h.accts[n][0], To: h.accts[n][1], Amount: 1, Currency: "EUR"}
		i := e.hist.Invoke(Op{Client: otherClientID, Key: key, Body: b, Path: "api", Via: n, Purpose: PurposeOtherClient})
		payload, _ := json.Marshal(api.TransferRequest{From: b.From, To: b.To, Amount: b.Amount, Currency: b.Currency})
		hdr := http.Header{}
		hdr.Set("Authorization", "Bearer "+h.otherKey)
		hdr.Set("Content-Type", "application/json")
		hdr.Set("Idempotency-Key", key)
		st, raw, err := e.do(ctx, n, http.MethodPost, "/v1/transfers", hdr, payload)
		if _, id := e.completeAnswer(i, st, raw, err); id != "" {
			h.xfers = append(h.xfers, id)
		}
	}
	if len(h.xfers) == 0 {
		return fmt.Errorf("the second client made no transfer")
	}
	return nil
}

// do sends one request to region via's API and returns the status and
// body.
func (e *env) do(ctx context.Context, via, method, path string, hdr http.Header, body []byte) (int, []byte, error) {
	r := e.c.Region(via)
	if r == nil {
		return 0, nil, fmt.Errorf("region %s not running", via)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.APIURL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header = hdr
	res, err := e.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(res.Body, 1<<16))
	return res.StatusCode, bytes.TrimSpace(raw), nil
}

// completeAnswer completes op i of the history with an API's answer to a
// transfer (an HTTP one, or a forwarded call's): a 2xx is ok, with the
// transfer ID its body names; a 4xx a fail; a 5xx or no answer unknown. It
// returns the outcome and the transfer ID.
func (e *env) completeAnswer(i, status int, body []byte, err error) (Outcome, string) {
	switch {
	case err != nil || status >= 500 || status < 200:
		e.hist.Complete(i, Unknown, fmt.Sprintf("%d %v %.300s", status, err, body), "")
		return Unknown, ""
	case status >= 400:
		e.hist.Complete(i, Fail, fmt.Sprintf("%d %.300s", status, body), "")
		return Fail, ""
	}
	var t api.TransferBody
	_ = json.Unmarshal(body, &t)
	e.hist.Complete(i, OK, fmt.Sprint(status), t.ID)
	return OK, t.ID
}

// jstr is s as a JSON string.
func jstr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// hostileCase builds the n-th hostile request of one kind.
type hostileCase func(h *hostility, e *env, n int) hostileReq

// base is a valid transfer of the workload's client between two of its
// own accounts in region via, with a fresh Idempotency-Key: each case
// spoils one thing of it.
func (h *hostility) base(e *env, n int) hostileReq {
	via := e.names[n%len(e.names)]
	from, to := e.accts[via][n%accountsPer], e.accts[via][(n+1)%accountsPer]
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+e.apiKey)
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Idempotency-Key", fmt.Sprintf("s%d-hostile-%d", e.seed, n))
	r := hostileReq{method: http.MethodPost, path: "/v1/transfers", header: hdr, client: clientID, via: via,
		rec: Body{Type: ledger.TypeTransfer, From: from, To: to, Amount: 1 + int64(n%1000), Currency: "EUR"}}
	r.body = transferJSON(jstr(from), jstr(to), fmt.Sprint(r.rec.Amount), `"EUR"`)
	return r
}

func transferJSON(from, to, amount, currency string) []byte {
	return fmt.Appendf(nil, `{"from":%s,"to":%s,"amount":%s,"currency":%s}`, from, to, amount, currency)
}

func withAmount(what, amount string) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what, r.rec.Amount = "amount "+what, 0
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), amount, `"EUR"`)
		return r
	}
}

func withFrom(what string, from func(h *hostility, e *env, r hostileReq) string) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = "from " + what
		r.rec.From = from(h, e, r)
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
		return r
	}
}

func withTo(what, to string) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what, r.rec.To = "to "+what, to
		r.body = transferJSON(jstr(r.rec.From), jstr(to), fmt.Sprint(r.rec.Amount), `"EUR"`)
		return r
	}
}

func withCurrency(what, currency string) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what, r.rec.Currency = "currency "+what, strings.Trim(currency, `"`)
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), currency)
		return r
	}
}

func withHeader(what string, edit func(h *hostility, e *env, hdr http.Header)) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = what
		edit(h, e, r.header)
		return r
	}
}

func withBody(what string, body func(r hostileReq) []byte) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what, r.body = what, body(r)
		return r
	}
}

func withContentType(what, ct string, body func(r hostileReq) []byte) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = "content type " + what
		r.header.Set("Content-Type", ct)
		r.body = body(r)
		return r
	}
}

// bola is a request of the workload's client (or, with other, of the
// second client) aimed at the other one's objects.
func bola(what string, build func(h *hostility, e *env, r *hostileReq)) hostileCase {
	return func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = "BOLA " + what
		build(h, e, &r)
		return r
	}
}

func (h *hostility) otherAcct(via string, n int) string { return h.accts[via][n%2] }

func get(r *hostileReq, path string) {
	r.method, r.path, r.body = http.MethodGet, path, nil
	r.header.Del("Idempotency-Key")
	r.header.Del("Content-Type")
}

// hostileCases are the hostile requests, sent round-robin.
var hostileCases = []hostileCase{
	// Amounts: zero, negative, fractions, exponents, strings, overflow,
	// other JSON types, other notations.
	withAmount("0", "0"), withAmount("-1", "-1"), withAmount("-0", "-0"), withAmount("min int64", "-9223372036854775808"),
	withAmount("1.5", "1.5"), withAmount("1.0", "1.0"), withAmount("1e3", "1e3"), withAmount("1E3", "1E3"),
	withAmount("1e-3", "1e-3"), withAmount(`"100"`, `"100"`), withAmount("2^63", "9223372036854775808"),
	withAmount("-2^63-1", "-9223372036854775809"), withAmount("10^29", "100000000000000000000000000000"),
	withAmount("null", "null"), withAmount("true", "true"), withAmount("[1]", "[1]"), withAmount(`{"v":1}`, `{"v":1}`),
	withAmount("0x10", "0x10"), withAmount("010", "010"), withAmount("+5", "+5"), withAmount("NaN", "NaN"),
	withAmount("Infinity", "Infinity"),
	withBody("amount missing", func(r hostileReq) []byte {
		return fmt.Appendf(nil, `{"from":%s,"to":%s,"currency":"EUR"}`, jstr(r.rec.From), jstr(r.rec.To))
	}),
	// Malformed and unknown account IDs.
	withFrom("empty", func(*hostility, *env, hostileReq) string { return "" }),
	withFrom("x", func(*hostility, *env, hostileReq) string { return "x" }),
	withFrom("region only", func(_ *hostility, _ *env, r hostileReq) string { return r.via + "-" }),
	withFrom("unknown region", func(_ *hostility, _ *env, r hostileReq) string {
		return "zz" + r.rec.From[strings.IndexByte(r.rec.From, '-'):]
	}),
	withFrom("upper case", func(_ *hostility, _ *env, r hostileReq) string { return strings.ToUpper(r.rec.From) }),
	withFrom("300 digits", func(*hostility, *env, hostileReq) string { return strings.Repeat("9", 300) }),
	withFrom("path traversal", func(*hostility, *env, hostileReq) string { return "../../v1/accounts" }),
	withFrom("SQL", func(_ *hostility, _ *env, r hostileReq) string { return r.rec.From + "' OR '1'='1" }),
	withFrom("NUL byte", func(_ *hostility, _ *env, r hostileReq) string { return r.rec.From + "\x00" }),
	withFrom("unicode", func(_ *hostility, _ *env, r hostileReq) string { return r.via + "-Ω" }),
	withFrom("well-formed, no such account", func(_ *hostility, e *env, r hostileReq) string { return e.id(r.via) }),
	withFrom("= to", func(_ *hostility, _ *env, r hostileReq) string { return r.rec.To }),
	withBody("from a number", func(r hostileReq) []byte {
		return transferJSON("123", jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	withBody("from an object", func(r hostileReq) []byte {
		return transferJSON(`{"id":`+jstr(r.rec.From)+`}`, jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	withTo("empty", ""), withTo("x", "x"), withTo("300 digits", strings.Repeat("9", 300)),
	// Currencies.
	withCurrency("eur", `"eur"`), withCurrency("XXX", `"XXX"`), withCurrency("EURO", `"EURO"`), withCurrency("empty", `""`),
	withCurrency("E1R", `"E1R"`), withCurrency("978", `978`), withCurrency("null", `null`), withCurrency("€", `"€"`),
	// Idempotency-Keys and API keys.
	withHeader("Idempotency-Key missing", func(_ *hostility, _ *env, hdr http.Header) { hdr.Del("Idempotency-Key") }),
	withHeader("Idempotency-Key empty", func(_ *hostility, _ *env, hdr http.Header) { hdr.Set("Idempotency-Key", "") }),
	withHeader("Idempotency-Key with a space", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Set("Idempotency-Key", hdr.Get("Idempotency-Key")+" x")
	}),
	withHeader("Idempotency-Key of 256 characters", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Set("Idempotency-Key", hdr.Get("Idempotency-Key")+"-"+strings.Repeat("k", 256))
	}),
	withHeader("Idempotency-Key of 32 KiB", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Set("Idempotency-Key", hdr.Get("Idempotency-Key")+"-"+strings.Repeat("k", 32<<10))
	}),
	withHeader("Idempotency-Key twice, both valid", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Add("Idempotency-Key", hdr.Get("Idempotency-Key")+"-second")
	}),
	withHeader("Idempotency-Key twice, the first invalid", func(_ *hostility, _ *env, hdr http.Header) {
		k := hdr.Get("Idempotency-Key")
		hdr.Set("Idempotency-Key", k+" bad")
		hdr.Add("Idempotency-Key", k)
	}),
	withHeader("Authorization missing", func(_ *hostility, _ *env, hdr http.Header) { hdr.Del("Authorization") }),
	withHeader("Authorization empty bearer", func(_ *hostility, _ *env, hdr http.Header) { hdr.Set("Authorization", "Bearer ") }),
	withHeader("Authorization Basic", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Set("Authorization", "Basic Y2hhb3M6Y2hhb3M=")
	}),
	withHeader("bad API key", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Set("Authorization", "Bearer pm_chaos_00000000000000000000000000000000")
	}),
	withHeader("API key with a suffix", func(_ *hostility, e *env, hdr http.Header) {
		hdr.Set("Authorization", "Bearer "+e.apiKey+"x")
	}),
	withHeader("API key of 64 KiB", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Set("Authorization", "Bearer "+strings.Repeat("k", 64<<10))
	}),
	withHeader("Authorization twice, the first bad", func(_ *hostility, e *env, hdr http.Header) {
		hdr.Set("Authorization", "Bearer pm_chaos_bad")
		hdr.Add("Authorization", "Bearer "+e.apiKey)
	}),
	withHeader("headers over 1 MiB", func(_ *hostility, _ *env, hdr http.Header) {
		hdr.Set("X-Padding", strings.Repeat("p", 1<<20+8<<10))
	}),
	// Bodies.
	withBody("body over the limit (16 KiB + padding)", func(r hostileReq) []byte {
		return append(bytes.Repeat([]byte(" "), api.MaxBodyBytes), r.body...)
	}),
	withBody("body of 1 MiB", func(r hostileReq) []byte {
		return append(r.body[:len(r.body)-1], fmt.Appendf(nil, `,"pad":"%s"}`, strings.Repeat("p", 1<<20))...)
	}),
	withBody("truncated body", func(r hostileReq) []byte { return r.body[:len(r.body)/2] }),
	withBody("body cut before its last brace", func(r hostileReq) []byte { return r.body[:len(r.body)-1] }),
	withBody("empty body", func(hostileReq) []byte { return nil }),
	withBody("body {}", func(hostileReq) []byte { return []byte("{}") }),
	withBody("body null", func(hostileReq) []byte { return []byte("null") }),
	withBody("body an array", func(r hostileReq) []byte { return append(append([]byte("["), r.body...), ']') }),
	withBody("trailing data", func(r hostileReq) []byte { return append(r.body, "{}"...) }),
	withBody("two objects", func(r hostileReq) []byte { return append(r.body, r.body...) }),
	withBody("unknown field", func(r hostileReq) []byte { return append(r.body[:len(r.body)-1], `,"memo":"x"}`...) }),
	withBody("field given twice", func(r hostileReq) []byte { return append(r.body[:len(r.body)-1], `,"amount":2}`...) }),
	withBody("case-folded field", func(r hostileReq) []byte { return bytes.Replace(r.body, []byte(`"amount"`), []byte(`"AMOUNT"`), 1) }),
	withBody("byte-order mark", func(r hostileReq) []byte { return append([]byte("\xef\xbb\xbf"), r.body...) }),
	withBody("invalid UTF-8", func(r hostileReq) []byte { return bytes.Replace(r.body, []byte(`"EUR"`), []byte("\"E\xffR\""), 1) }),
	withBody("nested 10000 deep", func(hostileReq) []byte {
		return []byte(strings.Repeat("[", 10000) + strings.Repeat("]", 10000))
	}),
	// Content types with bodies that are not JSON.
	withContentType("text/plain with a JSON body", "text/plain", func(r hostileReq) []byte { return r.body }),
	withContentType("form", "application/x-www-form-urlencoded", func(r hostileReq) []byte {
		return fmt.Appendf(nil, "from=%s&to=%s&amount=%d&currency=EUR", r.rec.From, r.rec.To, r.rec.Amount)
	}),
	withContentType("XML", "application/xml", func(r hostileReq) []byte {
		return fmt.Appendf(nil, "<transfer><from>%s</from><to>%s</to><amount>%d</amount></transfer>", r.rec.From, r.rec.To, r.rec.Amount)
	}),
	withContentType("multipart", "multipart/form-data; boundary=x", func(r hostileReq) []byte {
		return fmt.Appendf(nil, "--x\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n%d\r\n--x--\r\n", r.rec.Amount)
	}),
	// Methods and paths.
	func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what, r.method = "PUT /v1/transfers", http.MethodPut
		return r
	},
	func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what, r.method, r.path = "DELETE an own account", http.MethodDelete, "/v1/accounts/"+r.rec.From
		return r
	},
	func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = "entries with limit=-1"
		get(&r, "/v1/accounts/"+r.rec.From+"/entries?limit=-1")
		return r
	},
	func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = "entries with after=abc"
		get(&r, "/v1/accounts/"+r.rec.From+"/entries?after=abc")
		return r
	},
	func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = "GET a malformed account ID"
		get(&r, "/v1/accounts/%00%27%20OR%201=1")
		return r
	},
	func(h *hostility, e *env, n int) hostileReq {
		r := h.base(e, n)
		r.what = "GET a malformed transfer ID"
		get(&r, "/v1/transfers/"+strings.Repeat("9", 300))
		return r
	},
	// BOLA: the other client's accounts and transfers.
	bola("transfer from the other client's account", func(h *hostility, _ *env, r *hostileReq) {
		r.rec.From = h.otherAcct(r.via, int(r.rec.Amount))
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("transfer from the other client's account in another region", func(h *hostility, e *env, r *hostileReq) {
		r.rec.From = h.otherAcct(e.names[(e.intn(len(e.names)))], 0)
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("transfer between the other client's accounts", func(h *hostility, _ *env, r *hostileReq) {
		r.rec.From, r.rec.To = h.otherAcct(r.via, 0), h.otherAcct(r.via, 1)
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("transfer from a system account", func(h *hostility, _ *env, r *hostileReq) {
		r.rec.From = h.system[r.via]
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("transfer into the region's transit account", func(h *hostility, _ *env, r *hostileReq) {
		r.rec.To = h.transit[r.via]
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("hold into the region's transit account", func(h *hostility, _ *env, r *hostileReq) {
		r.rec.To, r.rec.Type = h.transit[r.via], typeHold
		r.body = fmt.Appendf(nil, `{"from":%s,"to":%s,"amount":%d,"currency":"EUR","hold":true}`, jstr(r.rec.From), jstr(r.rec.To), r.rec.Amount)
	}),
	bola("transfer into a system account", func(h *hostility, _ *env, r *hostileReq) {
		r.rec.To = h.system[r.via]
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("transfer from the region's transit account", func(h *hostility, _ *env, r *hostileReq) {
		r.rec.From = h.transit[r.via]
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("the other client's key, transfer from the workload's account", func(h *hostility, _ *env, r *hostileReq) {
		r.client = otherClientID
		r.header.Set("Authorization", "Bearer "+h.otherKey)
		r.rec.To = h.otherAcct(r.via, 0)
		r.body = transferJSON(jstr(r.rec.From), jstr(r.rec.To), fmt.Sprint(r.rec.Amount), `"EUR"`)
	}),
	bola("GET the other client's account", func(h *hostility, e *env, r *hostileReq) {
		get(r, "/v1/accounts/"+h.otherAcct(e.names[e.intn(len(e.names))], 1))
	}),
	bola("GET the other client's entries", func(h *hostility, e *env, r *hostileReq) {
		get(r, "/v1/accounts/"+h.otherAcct(e.names[e.intn(len(e.names))], 0)+"/entries")
	}),
	bola("GET the other client's transfer", func(h *hostility, e *env, r *hostileReq) {
		get(r, "/v1/transfers/"+h.xfers[e.intn(len(h.xfers))])
	}),
	bola("the other client's key, GET the workload's account", func(h *hostility, _ *env, r *hostileReq) {
		get(r, "/v1/accounts/"+r.rec.From)
		r.client = otherClientID
		r.header.Set("Authorization", "Bearer "+h.otherKey)
	}),
}

// send sends hostile request n, records it, and counts whether it was
// refused (a 4xx).
func (h *hostility) send(ctx context.Context, e *env, n int) {
	r := hostileCases[n%len(hostileCases)](h, e, n)
	key := r.header.Get("Idempotency-Key")
	i := -1
	if key != "" && r.method == http.MethodPost && r.path == "/v1/transfers" {
		i = e.hist.Invoke(Op{Client: r.client, Key: key, Body: r.rec, Path: "api", Via: r.via, Purpose: PurposeHostile})
	}
	h.sent.Add(1)
	e.sent.add(PurposeHostile)
	st, raw, err := e.do(ctx, r.via, r.method, r.path, r.header, r.body)
	detail := fmt.Sprintf("%s: %d %s", r.what, st, raw)
	if err != nil {
		detail = fmt.Sprintf("%s: no answer: %v", r.what, err)
	}
	if len(detail) > 300 {
		detail = detail[:300] + "…"
	}
	if i >= 0 {
		e.hist.Complete(i, Fail, "must be refused: "+detail, "")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.statuses[st]++
	if err == nil && st >= 400 && st < 500 {
		h.refused.Add(1)
		return
	}
	k := key
	if len(k) > 40 {
		k = k[:40] + "…"
	}
	h.wrong = append(h.wrong, fmt.Sprintf("#%d %s (%s %s via %s, client %s, key %q) not refused: %s", n, r.what,
		r.method, r.path, r.via, r.client, k, strings.TrimPrefix(detail, r.what+": ")))
}

// hostileScenario is the scenario 11: while the workload runs, a
// stream of hostile requests goes to the regions' APIs, round-robin over
// hostileCases: malformed amounts, IDs, currencies, headers and bodies,
// missing or bad API keys, and the workload client reaching for a second
// client's accounts and transfers (and the reverse). Every one must be
// refused with a 4xx (the fault counter counts them; the check "refused"
// names any that was not), and none may have an effect (I3: every one
// that names an Idempotency-Key is recorded as failed).
func hostileScenario() *scenario {
	h := &hostility{}
	return &scenario{
		name: "11-hostile-inputs",
		what: fmt.Sprintf("a second API client with funded accounts in every region; every 5 ms a hostile request through a "+
			"region's API, round-robin over %d cases: fuzzed amounts, malformed IDs and currencies, missing, duplicated and "+
			"oversized Idempotency-Keys and API keys, oversized, truncated and non-JSON bodies, unknown fields, and BOLA "+
			"(transfers from and reads of the other client's accounts and transfers); each must get a 4xx and have no effect",
			len(hostileCases)),
		counts: "hostile requests refused with a 4xx",
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			// The setup, every case at least once and each request run to
			// their ends even when the run is short.
			rctx := context.WithoutCancel(ctx)
			if err := h.setup(rctx, e); err != nil {
				return err
			}
			for n := 0; ctx.Err() == nil || n < len(hostileCases); n++ {
				h.send(rctx, e, n)
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Millisecond):
				}
			}
			return nil
		},
		fired: func(*env) int64 { return h.refused.Load() },
		extra: func(context.Context, *env) ([]Check, error) {
			chk := Check{Name: "refused", What: "every hostile request was refused with a 4xx (never a 2xx, 3xx or 5xx)", OK: true,
				Checked: h.sent.Load()}
			h.mu.Lock()
			defer h.mu.Unlock()
			var sts []string
			for _, st := range slices.Sorted(maps.Keys(h.statuses)) {
				sts = append(sts, fmt.Sprintf("%d×%d", st, h.statuses[st]))
			}
			chk.What += " (answers: " + strings.Join(sts, ", ") + "; 0 is no answer)"
			for _, w := range h.wrong {
				chk.fail("%s", w)
			}
			if s := h.sent.Load(); s < int64(len(hostileCases)) {
				chk.fail("only %d hostile requests sent, fewer than the %d cases", s, len(hostileCases))
			}
			return []Check{chk}, nil
		},
	}
}

func init() { registry = append(registry, hostileScenario) }
