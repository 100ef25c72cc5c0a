package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// Purposes of scenario 16's ops.
const (
	// PurposeForgedForward marks a transfer sent as a forged forwarded API
	// call: over NATS straight to a region's API, as a peer region's API
	// or another service could. The receiving API or the server must
	// refuse it, so it is recorded as failed: I3 then requires that it has
	// no effect.
	PurposeForgedForward = "forged-forward"
	// PurposeForwardControl marks a well-formed forwarded transfer of the
	// workload's client, sent the same way from an API's user: the API's
	// credential is trusted, so it must be applied, which shows that the
	// forged calls are refused for what they spoil, and that the API
	// serves on.
	PurposeForwardControl = "forward-control"
)

// forwardedReply is the answer to a forwarded call (reply.go's reply, as
// forward.go reads it back): that type is unexported, so its two fields
// the scenario reads are spelled here under the same names.
type forwardedReply struct {
	Status int    `json:"status"`
	Body   []byte `json:"body"`
}

// The operations a region's API serves to the others, by the names
// services/api's operations give them (captures and voids are named by
// their ledger types).
const (
	opCreateTransfer = "create_transfer"
	opGetTransfer    = "get_transfer"
	opCreateAccount  = "create_account"
	opGetAccount     = "get_account"
	opListEntries    = "list_entries"
	opCreateRefund   = "create_refund"
)

// forgedCall is one forwarded call of scenario 16.
type forgedCall struct {
	what string
	to   string // the region whose API receives it
	call api.Call
	// req is a transfer call's body: call.Body is its JSON unless set.
	req *api.TransferRequest
	// raw is sent instead of the call's JSON when set: a message no
	// api.Call spells.
	raw []byte
}

// data is the message that carries the call.
func (fc forgedCall) data() []byte {
	if fc.raw != nil {
		return fc.raw
	}
	c := fc.call
	if c.Body == nil && fc.req != nil {
		c.Body, _ = json.Marshal(fc.req)
	}
	b, _ := json.Marshal(c)
	return b
}

// record is the history's op of a transfer call that names a client and a
// key, or false for any other call.
func (fc forgedCall) record(purpose string) (Op, bool) {
	if fc.call.Op != opCreateTransfer || fc.call.Client == "" || fc.call.Key == "" {
		return Op{}, false
	}
	b := Body{Type: ledger.TypeTransfer}
	if fc.req != nil {
		b.From, b.To, b.Amount, b.Currency = fc.req.From, fc.req.To, fc.req.Amount, fc.req.Currency
	}
	return Op{Client: fc.call.Client, Key: fc.call.Key, Body: b, Path: "forwarded", Via: fc.to, Purpose: purpose}, true
}

// forwardCase is one kind of forged call from an API's user: it spoils a
// valid transfer call of the workload's client (or replaces it). The
// receiving API must refuse it with a 4xx: its forward check with reason
// why when checked is set (forwardcheck.go), or a later stage of the
// operation.
type forwardCase struct {
	what    string
	checked bool
	why     api.Refusal
	spoil   func(f *forwardForgery, e *env, fc *forgedCall)
}

// byCheck is a case the receiver's forward check refuses for why.
func byCheck(why api.Refusal, what string, spoil func(f *forwardForgery, e *env, fc *forgedCall)) forwardCase {
	return forwardCase{what: what, checked: true, why: why, spoil: spoil}
}

// byOperation is a case that passes the forward check and is refused by
// the operation it names (its body's decoding, the owner check, the
// system accounts, the ledger's validation).
func byOperation(what string, spoil func(f *forwardForgery, e *env, fc *forgedCall)) forwardCase {
	return forwardCase{what: what, spoil: spoil}
}

// withAmountJSON gives a transfer call a body whose amount is spelled
// amount.
func withAmountJSON(amount string) func(*forwardForgery, *env, *forgedCall) {
	return func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Body = fmt.Appendf(nil, `{"from":%s,"to":%s,"amount":%s,"currency":"EUR"}`, jstr(fc.req.From), jstr(fc.req.To), amount)
	}
}

// asRead makes the call op on account (a read: no key, no body).
func asRead(fc *forgedCall, op, account string) {
	fc.call = api.Call{Op: op, Client: fc.call.Client, ID: account}
	fc.req = nil
}

// elsewhere is a region other than fc's receiver.
func (fc forgedCall) elsewhere(e *env) string {
	i := slices.Index(e.names, fc.to)
	return e.names[(i+1)%len(e.names)]
}

// forwardCases are scenario 16's forged calls from an API's user, sent
// round-robin.
var forwardCases = []forwardCase{
	// Fields the transfer operation does not take: run without the check,
	// each would be applied.
	byCheck(api.RefusedTarget, "transfer with a refund's target", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Target = &api.RefundTarget{From: fc.req.From, To: fc.req.To, Currency: "EUR"}
	}),
	byCheck(api.RefusedPage, "transfer with a page limit", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Limit = 5 }),
	byCheck(api.RefusedPage, "transfer with a page cursor", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.After = 7 }),
	byCheck(api.RefusedID, "transfer with an id", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.ID = fc.req.From }),
	// Idempotency keys.
	byCheck(api.RefusedKey, "transfer without a key", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Key = "" }),
	byCheck(api.RefusedKey, "key with a space", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Key += " x" }),
	byCheck(api.RefusedKey, "key of 256 characters", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Key += "-" + strings.Repeat("k", 256)
	}),
	byCheck(api.RefusedKey, "key not ASCII", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Key += "-ключ" }),
	// Clients.
	byCheck(api.RefusedClient, "client missing", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Client = "" }),
	byCheck(api.RefusedClient, "client malformed", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Client = "ch/aos" }),
	byCheck(api.RefusedClient, "client of 65 characters", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Client = strings.Repeat("c", 65)
	}),
	byOperation("client another's, source the workload's account", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Client = otherClientID
	}),
	byOperation("client registered nowhere", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Client = "chaos-nobody" }),
	byOperation("source another client's account", func(f *forwardForgery, _ *env, fc *forgedCall) { fc.req.From = f.other[fc.to] }),
	// Amounts and currencies.
	byOperation("amount 0", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.req.Amount = 0 }),
	byOperation("amount -1", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.req.Amount = -1 }),
	byOperation("amount min int64", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.req.Amount = -1 << 63 }),
	byOperation("amount 2^63", withAmountJSON("9223372036854775808")),
	byOperation("amount 10^30", withAmountJSON("1000000000000000000000000000000")),
	byOperation("amount 1.5", withAmountJSON("1.5")),
	byOperation("amount a string", withAmountJSON(`"100"`)),
	byOperation("currency eur", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.req.Currency = "eur" }),
	byOperation("source = destination", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.req.To = fc.req.From }),
	// System accounts.
	byOperation("destination the region's transit account", func(f *forwardForgery, _ *env, fc *forgedCall) {
		fc.req.To = f.transit[fc.to]
	}),
	byOperation("source the region's transit account", func(f *forwardForgery, _ *env, fc *forgedCall) {
		fc.req.From = f.transit[fc.to]
	}),
	byOperation("source the region's issuance account", func(f *forwardForgery, _ *env, fc *forgedCall) {
		fc.req.From = f.issuance[fc.to]
	}),
	byOperation("destination the region's issuance account", func(f *forwardForgery, _ *env, fc *forgedCall) {
		fc.req.To = f.issuance[fc.to]
	}),
	// The wrong region.
	byOperation("transfer homed in another region", func(_ *forwardForgery, e *env, fc *forgedCall) {
		there := fc.elsewhere(e)
		fc.req.From, fc.req.To = e.accts[there][0], e.accts[there][1]
	}),
	byCheck(api.RefusedID, "entries of an account homed in another region", func(_ *forwardForgery, e *env, fc *forgedCall) {
		asRead(fc, opListEntries, e.accts[fc.elsewhere(e)][0])
		fc.call.Limit = 10
	}),
	byCheck(api.RefusedID, "account homed in another region", func(_ *forwardForgery, e *env, fc *forgedCall) {
		asRead(fc, opGetAccount, e.accts[fc.elsewhere(e)][0])
	}),
	// Bodies and messages.
	byCheck(api.RefusedBody, "transfer without a body", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.req = nil }),
	byCheck(api.RefusedBody, "body over 16 KiB", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Body = fmt.Appendf(nil, `{"from":%s,"to":%s,"amount":1,"currency":"EUR","pad":%q}`, jstr(fc.req.From), jstr(fc.req.To),
			strings.Repeat("p", api.MaxBodyBytes))
	}),
	byOperation("body a JSON string", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Body = json.RawMessage(jstr("from=" + fc.req.From + "&to=" + fc.req.To + "&amount=1&currency=EUR"))
	}),
	byOperation("body with an unknown field", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call.Body = fmt.Appendf(nil, `{"from":%s,"to":%s,"amount":1,"currency":"EUR","client":%q}`, jstr(fc.req.From), jstr(fc.req.To),
			otherClientID)
	}),
	byCheck(api.RefusedMalformed, "body not JSON", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.raw = fmt.Appendf(nil, `{"op":%q,"client":%q,"key":%q,"body":from=%s&amount=1}`, opCreateTransfer, fc.call.Client, fc.call.Key, fc.req.From)
	}),
	byCheck(api.RefusedMalformed, "message not JSON", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.raw = []byte("create_transfer please") }),
	byCheck(api.RefusedMalformed, "message a JSON array", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.raw = []byte(`[1,2,3]`) }),
	byCheck(api.RefusedOp, "unknown operation", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Op = "drop_accounts" }),
	byCheck(api.RefusedOp, "operation missing", func(_ *forwardForgery, _ *env, fc *forgedCall) { fc.call.Op = "" }),
	// Pages of an account's entries.
	byCheck(api.RefusedPage, "entries with limit 0 (absent)", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opListEntries, fc.req.From)
	}),
	byCheck(api.RefusedPage, "entries with limit -1", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opListEntries, fc.req.From)
		fc.call.Limit = -1
	}),
	byCheck(api.RefusedPage, "entries with limit 501", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opListEntries, fc.req.From)
		fc.call.Limit = api.MaxPageLimit + 1
	}),
	byCheck(api.RefusedPage, "entries with limit max int", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opListEntries, fc.req.From)
		fc.call.Limit = int(^uint(0) >> 1)
	}),
	byCheck(api.RefusedPage, "entries after -1", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opListEntries, fc.req.From)
		fc.call.Limit, fc.call.After = 10, -1
	}),
	byOperation("entries of another client's account", func(f *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opListEntries, f.other[fc.to])
		fc.call.Limit = 10
	}),
	// Other operations.
	byCheck(api.RefusedPage, "account with a page", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opGetAccount, fc.req.From)
		fc.call.Limit = 5
	}),
	byCheck(api.RefusedKey, "account with a key", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		key := fc.call.Key
		asRead(fc, opGetAccount, fc.req.From)
		fc.call.Key = key
	}),
	byOperation("another client's account", func(f *forwardForgery, _ *env, fc *forgedCall) { asRead(fc, opGetAccount, f.other[fc.to]) }),
	byCheck(api.RefusedID, "transfer read by a malformed id", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		asRead(fc, opGetTransfer, fc.to+"-0000")
	}),
	byCheck(api.RefusedID, "account opened with an id", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call = api.Call{Op: opCreateAccount, Client: fc.call.Client, ID: fc.req.From, Body: json.RawMessage(`{"currency":"EUR"}`)}
		fc.req = nil
	}),
	byOperation("account opened for another region", func(_ *forwardForgery, e *env, fc *forgedCall) {
		fc.call = api.Call{Op: opCreateAccount, Client: fc.call.Client, Body: fmt.Appendf(nil, `{"currency":"EUR","region":%q}`, fc.elsewhere(e))}
		fc.req = nil
	}),
	byOperation("account opened for a client registered nowhere", func(_ *forwardForgery, _ *env, fc *forgedCall) {
		fc.call = api.Call{Op: opCreateAccount, Client: "chaos-nobody", Body: json.RawMessage(`{"currency":"EUR"}`)}
		fc.req = nil
	}),
	byOperation("capture of a transfer that does not exist", func(_ *forwardForgery, e *env, fc *forgedCall) {
		fc.call = api.Call{Op: ledger.TypeCapture, Client: fc.call.Client, ID: e.id(fc.to), Key: fc.call.Key}
		fc.req = nil
	}),
	byCheck(api.RefusedKey, "void with a key with a space", func(_ *forwardForgery, e *env, fc *forgedCall) {
		fc.call = api.Call{Op: ledger.TypeVoid, Client: fc.call.Client, ID: e.id(fc.to), Key: fc.call.Key + " x"}
		fc.req = nil
	}),
	byCheck(api.RefusedTarget, "refund whose payee's account is in another region", func(_ *forwardForgery, e *env, fc *forgedCall) {
		fc.call = api.Call{Op: opCreateRefund, Client: fc.call.Client, ID: e.id(fc.to), Key: fc.call.Key,
			Target: &api.RefundTarget{From: fc.req.From, To: e.accts[fc.elsewhere(e)][0], Currency: "EUR"}}
		fc.req = nil
	}),
	byCheck(api.RefusedTarget, "refund without a target", func(_ *forwardForgery, e *env, fc *forgedCall) {
		fc.call = api.Call{Op: opCreateRefund, Client: fc.call.Client, ID: e.id(fc.to), Key: fc.call.Key}
		fc.req = nil
	}),
}

// forwardForgery is scenario 16's state: connections as every region's
// API, router, ledger and operator users, the accounts the forged calls
// name, and what the forgeries got back.
type forwardForgery struct {
	conns map[string]*nats.Conn // by user name
	// violations counts, by user name, the publishes its server refused
	// (permission violations, reported asynchronously).
	violations map[string]*atomic.Int64
	other      map[string]string // region -> an account of the second client (floor -funding)
	transit    map[string]string // region -> its transit account (EUR)
	issuance   map[string]string // region -> its issuance account (EUR)

	calls, refused, controls atomic.Int64
	mu                       sync.Mutex
	statuses                 map[int]int
	wrong                    []string         // the calls that were not refused
	badControls              []string         // the controls that were not answered 2xx
	published                map[string]int64 // by user name: forwarded calls published as a user that may not
	keys                     []clientKey      // of every forged transfer call
	// expected counts, by reason, the calls sent that the receivers'
	// forward check must refuse; counted what their Stats counted during
	// the forgeries.
	expected, counted map[api.Refusal]int64
}

// forwardUsers are the services whose users may not send forwarded calls.
var forwardUsers = []string{natsauth.Router, natsauth.Ledger, natsauth.Ops}

// setup opens, in every region, an account of the second client that
// may go a funding into overdraft (so that a call that moved its money
// would not fail for want of it), finds the region's transit and issuance
// accounts, and connects as every region's API, router, ledger and
// operator users.
func (f *forwardForgery) setup(ctx context.Context, e *env) error {
	f.other, f.transit, f.issuance = map[string]string{}, map[string]string{}, map[string]string{}
	f.statuses, f.published, f.expected = map[int]int{}, map[string]int64{}, map[api.Refusal]int64{}
	for _, n := range e.names {
		store := e.c.Region(n).Ledger.Store
		a, _, err := store.CreateAccount(ctx, ledger.NewAccount{ClientID: otherClientID, Currency: "EUR", Floor: -funding})
		if err != nil {
			return fmt.Errorf("an account of %s in %s: %w", otherClientID, n, err)
		}
		f.other[n] = a.ID
		for kind, into := range map[ledger.Kind]map[string]string{ledger.KindTransit: f.transit, ledger.KindIssuance: f.issuance} {
			var id string
			if err := store.Pool().QueryRow(ctx, `SELECT id FROM accounts WHERE kind = $1 AND currency = 'EUR'`, kind).Scan(&id); err != nil {
				return fmt.Errorf("the %s account of %s: %w", kind, n, err)
			}
			into[n] = id
		}
	}
	f.conns, f.violations = map[string]*nats.Conn{}, map[string]*atomic.Int64{}
	for _, r := range e.names {
		for _, service := range append([]string{natsauth.API}, forwardUsers...) {
			refused := new(atomic.Int64)
			nc, name, err := connectAs(e, r, service, refused)
			if err != nil {
				return err
			}
			f.conns[name], f.violations[name] = nc, refused
		}
	}
	return nil
}

func (f *forwardForgery) close() {
	for _, nc := range f.conns {
		nc.Close()
	}
}

// base is a valid transfer call of the workload's client between two of
// its accounts homed in region to, with a key of its own: each case
// spoils it.
func (f *forwardForgery) base(e *env, to, key string, n int) forgedCall {
	req := &api.TransferRequest{From: e.accts[to][n%accountsPer], To: e.accts[to][(n+1)%accountsPer], Amount: 1 + int64(n%100), Currency: "EUR"}
	return forgedCall{to: to, req: req, call: api.Call{Op: opCreateTransfer, Client: clientID, Key: key}}
}

// request sends fc from region from's API user and returns the answer.
func (f *forwardForgery) request(ctx context.Context, from string, fc forgedCall) (forwardedReply, error) {
	var rep forwardedReply
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := f.conns[natsauth.UserName(natsauth.API, from)].RequestWithContext(rctx, api.ForwardSubject(fc.to), fc.data())
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return rep, fmt.Errorf("reply %.100q: %w", msg.Data, err)
	}
	return rep, nil
}

// send sends forged call n, from an API user of another region than the
// receiver's, records a transfer call as failed, and counts whether it was
// refused (a 4xx).
func (f *forwardForgery) send(ctx context.Context, e *env, n int) {
	c := forwardCases[n%len(forwardCases)]
	to := e.names[n%len(e.names)]
	from := e.names[(n+1)%len(e.names)]
	fc := f.base(e, to, fmt.Sprintf("s%d-fwd-%d", e.seed, n), n)
	fc.what = c.what
	c.spoil(f, e, &fc)
	i := -1
	if op, ok := fc.record(PurposeForgedForward); ok {
		i = e.hist.Invoke(op)
		f.mu.Lock()
		f.keys = append(f.keys, clientKey{op.Client, op.Key})
		f.mu.Unlock()
	}
	f.calls.Add(1)
	rep, err := f.request(ctx, from, fc)
	detail := fmt.Sprintf("%d %.240s", rep.Status, rep.Body)
	if err != nil {
		detail = fmt.Sprintf("no answer: %v", err)
	}
	if i >= 0 {
		e.hist.Complete(i, Fail, fc.what+": must be refused: "+detail, "")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses[rep.Status]++
	if c.checked {
		f.expected[c.why]++
	}
	if err == nil && rep.Status >= 400 && rep.Status < 500 {
		f.refused.Add(1)
		return
	}
	f.wrong = append(f.wrong, fmt.Sprintf("#%d %s (%s to %s from api-%s, client %q, key %.40q) not refused: %s", n, c.what,
		fc.call.Op, fc.to, from, fc.call.Client, fc.call.Key, detail))
}

// finalControls numbers the control calls sent after the forgeries, apart
// from those sent among them (a multiple of 3: see control).
const finalControls = 3 << 20

// control sends a well-formed call from an API user (a read of an
// account, a page of its entries, or a transfer, by n): each must be
// answered 2xx, and the transfer applied.
func (f *forwardForgery) control(ctx context.Context, e *env, to string, n int) {
	from := e.names[(slices.Index(e.names, to)+1+n%2)%len(e.names)]
	fc := f.base(e, to, fmt.Sprintf("s%d-fwd-control-%d", e.seed, n), n)
	switch n % 3 {
	case 0:
		asRead(&fc, opGetAccount, fc.req.From)
	case 1:
		asRead(&fc, opListEntries, fc.req.From)
		fc.call.Limit = 1
	}
	i := -1
	if op, ok := fc.record(PurposeForwardControl); ok {
		i = e.hist.Invoke(op)
	}
	f.controls.Add(1)
	rep, err := f.request(ctx, from, fc)
	if i >= 0 {
		_, _ = e.completeAnswer(i, rep.Status, rep.Body, err)
	}
	if err == nil && rep.Status >= 200 && rep.Status < 300 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.badControls = append(f.badControls, fmt.Sprintf("control %s to %s from api-%s: %d %.200s (%v)", fc.call.Op, to, from, rep.Status, rep.Body, err))
}

// publish sends, as a router, a ledger and an operator user (of the
// regions in turn, by n), a valid transfer call of the workload's client
// to a region's API (its own or another's): the server must refuse every
// one, and none may be applied.
func (f *forwardForgery) publish(e *env, n int) {
	for k, service := range forwardUsers {
		from := e.names[(n+k)%len(e.names)]
		to := e.names[(n+2*k)%len(e.names)]
		user := natsauth.UserName(service, from)
		fc := f.base(e, to, fmt.Sprintf("s%d-fwd-%s-%d", e.seed, user, n), n)
		op, _ := fc.record(PurposeForgedForward)
		i := e.hist.Invoke(op)
		nc := f.conns[user]
		_ = nc.Publish(api.ForwardSubject(to), fc.data())
		_ = nc.Flush()
		e.hist.Complete(i, Fail, "published as "+user+": the server must refuse it", "")
		f.mu.Lock()
		f.published[user]++
		f.keys = append(f.keys, clientKey{op.Client, op.Key})
		f.mu.Unlock()
	}
}

// awaitViolations waits up to 2 s for the servers' asynchronous reports of
// the refused publishes.
func (f *forwardForgery) awaitViolations() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		done := true
		for user, n := range f.published {
			done = done && f.violations[user].Load() >= n
		}
		if done {
			return
		}
	}
}

// refusals sums the forwarded calls every region's API refused, by reason
// (its paymesh_forwarded_calls_refused_total).
func refusals(e *env) map[api.Refusal]int64 {
	out := map[api.Refusal]int64{}
	for _, n := range e.names {
		for _, why := range api.Refusals {
			out[why] += e.c.Region(n).API.Stats.Refused(why)
		}
	}
	return out
}

// checks are scenario 16's own: refused, counted, server refused and
// applied.
func (f *forwardForgery) checks(ctx context.Context, e *env) ([]Check, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var sts []string
	for _, st := range slices.Sorted(maps.Keys(f.statuses)) {
		sts = append(sts, fmt.Sprintf("%d×%d", st, f.statuses[st]))
	}
	refused := Check{Name: "refused", OK: true, Checked: f.calls.Load(),
		What: fmt.Sprintf("every forged forwarded call from an API user was refused with a 4xx, never a 2xx or 5xx (%d calls, %d refused; "+
			"answers: %s, 0 is no answer), and every well-formed control call answered 2xx (%d controls)",
			f.calls.Load(), f.refused.Load(), strings.Join(sts, ", "), f.controls.Load())}
	for _, w := range f.wrong {
		refused.fail("%s", w)
	}
	for _, c := range f.badControls {
		refused.fail("%s: a well-formed call was not served, so the forged calls' refusals say nothing", c)
	}
	if n := f.calls.Load(); n < int64(len(forwardCases)) {
		refused.fail("only %d forged calls sent, fewer than the %d cases", n, len(forwardCases))
	}

	counted := Check{Name: "counted", OK: true,
		What: "the receiving APIs counted each call their forward check refused, by reason (paymesh_forwarded_calls_refused_total)"}
	for _, why := range api.Refusals {
		counted.Checked += f.expected[why]
		if got, want := f.counted[why], f.expected[why]; got != want {
			counted.fail("reason %s: %d counted, %d calls the check must refuse for it", why, got, want)
		}
	}

	server := Check{Name: "server refused", OK: true,
		What: "every forwarded call published as a region's router, ledger or operator user was refused by its server (a permission violation)"}
	for _, user := range slices.Sorted(maps.Keys(f.published)) {
		n, got := f.published[user], f.violations[user].Load()
		server.Checked += n
		if got != n {
			server.fail("%s published %d forwarded calls, %d refused", user, n, got)
		}
	}
	applied, err := checkUnapplied(ctx, e.c, "no forged forwarded call made a transfer or an entry, in any region", f.keys)
	return []Check{refused, counted, server, applied}, err
}

// fired is the fault counter: the calls refused with a 4xx and the
// publishes the servers refused.
func (f *forwardForgery) fired() int64 {
	n := f.refused.Load()
	for _, v := range f.violations {
		n += v.Load()
	}
	return n
}

// forwardsScenario is issue 25's forged forwarded calls: while the
// workload runs, every region's API user sends forged forwarded calls to
// the other regions' APIs, round-robin over forwardCases (fields out of
// range or not taken, malformed keys and clients, other clients' and
// system accounts, the wrong region, bodies and messages that are not
// JSON, unknown operations), with a well-formed control call every eighth;
// and after every tenth the regions' router, ledger and operator users
// publish valid forwarded transfers, which they may not send. Each forged
// call must be
// refused (a 4xx from the receiver, a permission violation from the
// server) and none may have an effect.
func forwardsScenario() *scenario {
	f := &forwardForgery{}
	return &scenario{
		name: "16-forged-forwards",
		what: fmt.Sprintf("one after another, 5 ms apart, forged forwarded API calls over NATS from a region's API user to another "+
			"region's API, going round %d cases: fields its operation does not take (a transfer with a target, page or id), "+
			"malformed and missing keys and clients, another client's accounts, amounts out of range, system accounts, the wrong "+
			"region, limit 0, negative and huge, non-JSON bodies and messages, unknown operations; each must get a 4xx (its forward "+
			"check's refusals counted by reason) and have no effect, while a well-formed control call every eighth is answered 2xx. "+
			"After every tenth, a router, a ledger and an operator user, of the regions in turn, each publish a valid forwarded "+
			"transfer: the servers must refuse each", len(forwardCases)),
		counts: "forged forwarded calls refused (a 4xx from the receiving API, or a permission violation from the server)",
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			// The setup, every case at least once and each call run to its
			// end even when the run is short.
			rctx := context.WithoutCancel(ctx)
			if err := f.setup(rctx, e); err != nil {
				return err
			}
			defer f.close()
			before := refusals(e)
			for n := 0; ctx.Err() == nil || n < len(forwardCases); n++ {
				f.send(rctx, e, n)
				if n%8 == 7 {
					f.control(rctx, e, e.names[n%len(e.names)], n/8)
				}
				if n%10 == 9 {
					f.publish(e, n/10)
				}
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Millisecond):
				}
			}
			// The APIs serve on: a control of each kind in every region.
			for k, to := range e.names {
				for kind := range 3 {
					f.control(rctx, e, to, finalControls+3*k+kind)
				}
			}
			f.awaitViolations()
			f.mu.Lock()
			defer f.mu.Unlock()
			f.counted = refusals(e)
			for why, n := range before {
				f.counted[why] -= n
			}
			return nil
		},
		fired: func(*env) int64 { return f.fired() },
		extra: f.checks,
	}
}

func init() { registry = append(registry, forwardsScenario) }
