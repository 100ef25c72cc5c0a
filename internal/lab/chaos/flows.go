package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// The workload's money flows beyond "move now": holds that are captured
// (in part or whole), voided, raced (a capture against a void) or left to
// expire, transfers refunded by their payee, in parts, twice, past
// their total, or by two refunds at once that cannot both fit, and
// accounts frozen, unfrozen and closed, then paid (refused in their region,
// refunded from another). Each request
// is an op of the history under its own idempotency key, so the checker
// holds every one to its effect.

// Shares of the workload's requests that start a flow, and how long a
// hold lives (every hold is captured, voided or expired before the checks).
const (
	holdShare    = 0.12
	refundShare  = 0.06
	accountShare = 0.03
	holdLife     = time.Second
)

// Body types of the flows' ops (transfers keep their command type).
const (
	typeHold = "hold"
)

// noteHold records a hold's expiry: the checks wait until every hold is due.
func (e *env) noteHold(at time.Time) {
	for {
		cur := e.holdsDue.Load()
		if at.UnixMilli() <= cur || e.holdsDue.CompareAndSwap(cur, at.UnixMilli()) {
			return
		}
	}
}

// waitForHolds waits until every hold of the run is past its expiry.
func (e *env) waitForHolds(ctx context.Context) {
	if ms := e.holdsDue.Load(); ms > 0 {
		select {
		case <-time.After(time.Until(time.UnixMilli(ms).Add(300 * time.Millisecond))):
		case <-ctx.Done():
		}
	}
}

// holdFlow authorizes b (through the API or a router) and then acts on the
// hold: captures it (all, or about half), voids it, sends a capture and a
// void at once, or leaves it to expire.
func (e *env) holdFlow(ctx context.Context, rng *mrand.Rand, key, home, via string, viaAPI bool, b Body) {
	b.Type = typeHold
	expires := time.Now().Add(holdLife)
	e.noteHold(expires)
	cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: e.id(home), ClientID: clientID, IdempotencyKey: key,
		From: b.From, To: b.To, Amount: b.Amount, Currency: b.Currency, CreatedAt: time.Now(), Hold: true, ExpiresAt: expires}
	id := cmd.TransferID
	if viaAPI {
		payload, _ := json.Marshal(api.TransferRequest{From: b.From, To: b.To, Amount: b.Amount, Currency: b.Currency, Hold: true, ExpiresAt: &expires})
		var o Outcome
		if o, id = e.postUntilKnownAt(ctx, PurposeFirst, via, key, b, "/v1/transfers", payload); o != OK {
			return
		}
	} else if e.submitUntilKnown(ctx, PurposeFirst, via, cmd) != OK {
		return
	}
	// Every choice is drawn here, before any goroutine: the request's
	// generator is not shared, and a seed replays the same requests.
	amount := b.Amount
	if rng.IntN(2) == 0 {
		amount = b.Amount/2 + 1
	}
	captureVia, voidVia := e.names[rng.IntN(len(e.names))], e.names[rng.IntN(len(e.names))]
	x := rng.Float64()
	capture := func() { e.act(ctx, captureVia, key+"-capture", ledger.TypeCapture, id, amount) }
	void := func() { e.act(ctx, voidVia, key+"-void", ledger.TypeVoid, id, 0) }
	e.later.Go(func() {
		if !viaAPI {
			// A router's ack says the hold is stored, not applied yet: give
			// the ledger its moment, as a client acting on a webhook would.
			time.Sleep(300 * time.Millisecond)
		}
		switch {
		case x < 0.35:
			capture()
		case x < 0.6:
			void()
		case x < 0.8:
			var wg sync.WaitGroup
			wg.Go(capture)
			wg.Go(void)
			wg.Wait()
		default: // left to expire
		}
	})
}

// accountFlow opens an empty account in the region of b's destination,
// freezes, unfreezes and closes it through the API of regions drawn now,
// each once the one before is known, and then pays it b through a router:
// a payment from its own region is refused (account_closed), one from
// another region is refused there and refunded to its sender.
func (e *env) accountFlow(ctx context.Context, rng *mrand.Rand, key, via string, b Body) {
	vias := [3]string{e.names[rng.IntN(len(e.names))], e.names[rng.IntN(len(e.names))], e.names[rng.IntN(len(e.names))]}
	dst, _ := e.c.IDs().HomeRegion(b.To)
	r := e.c.Region(dst)
	if r == nil {
		return
	}
	a, _, err := r.Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: clientID, Currency: "EUR"})
	if err != nil {
		return // the region's database is away: no flow
	}
	e.later.Go(func() {
		for i, op := range []string{ledger.TypeFreeze, ledger.TypeUnfreeze, ledger.TypeClose} {
			e.postUntilKnownAt(ctx, PurposeFirst, vias[i], key+"-"+op, Body{Type: op, Currency: "EUR"}, "/v1/accounts/"+a.ID+"/"+op, nil, a.ID)
		}
		// Through a router: the payment is in a stream until it applies,
		// so the checks' wait for quiet streams covers it.
		home, _ := e.c.IDs().HomeRegion(b.From)
		e.submitUntilKnown(ctx, PurposeFirst, via, ledger.Command{Type: ledger.TypeTransfer, TransferID: e.id(home), ClientID: clientID,
			IdempotencyKey: key, From: b.From, To: a.ID, Amount: b.Amount, Currency: b.Currency, CreatedAt: time.Now()})
	})
}

// act sends a capture or void of the hold id through the API of via.
func (e *env) act(ctx context.Context, via, key, op, id string, amount int64) {
	var payload []byte
	if amount > 0 {
		payload, _ = json.Marshal(api.ActionRequest{Amount: amount})
	}
	b := Body{Type: op, Amount: amount, Currency: "EUR"}
	e.postUntilKnownAt(ctx, PurposeFirst, via, key, b, "/v1/transfers/"+id+"/"+op, payload, id)
}

// refundFlow pays b, then has the payee refund it: in two parts and once
// more past the total, or by two refunds at once of which only one fits.
func (e *env) refundFlow(ctx context.Context, rng *mrand.Rand, key, home, via string, viaAPI bool, b Body) {
	cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: e.id(home), ClientID: clientID, IdempotencyKey: key,
		From: b.From, To: b.To, Amount: b.Amount, Currency: b.Currency, CreatedAt: time.Now()}
	id := cmd.TransferID
	if viaAPI {
		payload, _ := json.Marshal(api.TransferRequest{From: b.From, To: b.To, Amount: b.Amount, Currency: b.Currency})
		var o Outcome
		if o, id = e.postUntilKnownAt(ctx, PurposeFirst, via, key, b, "/v1/transfers", payload); o != OK {
			return
		}
	} else if e.submitUntilKnown(ctx, PurposeFirst, via, cmd) != OK {
		return
	}
	payee, _ := e.c.IDs().HomeRegion(b.To)
	part := b.Amount/2 + 1
	// Every choice is drawn before any goroutine (see holdFlow).
	type send struct {
		viaAPI bool
		via    string
	}
	var sends [3]send
	for i := range sends {
		sends[i] = send{rng.Float64() < apiShare, e.names[rng.IntN(len(e.names))]}
	}
	sequential := rng.IntN(2) == 0
	refund := func(n int, amount int64) {
		rb := Body{Type: ledger.TypeRefund, From: b.To, To: b.From, Amount: amount, Currency: b.Currency}
		rkey := fmt.Sprintf("%s-refund%d", key, n)
		if sd := sends[n-1]; sd.viaAPI {
			payload, _ := json.Marshal(api.ActionRequest{Amount: amount})
			e.postUntilKnownAt(ctx, PurposeFirst, sd.via, rkey, rb, "/v1/transfers/"+id+"/refunds", payload)
			return
		}
		c := ledger.Command{Type: ledger.TypeRefund, TransferID: e.id(payee), ClientID: clientID, IdempotencyKey: rkey,
			From: b.To, To: b.From, Amount: amount, Currency: b.Currency, CreatedAt: time.Now(), RefundOf: id}
		e.submitUntilKnown(ctx, PurposeFirst, sends[n-1].via, c)
	}
	e.later.Go(func() {
		// Give the payment the moment its credit takes (a router's ack says
		// it is stored, not applied); a refund that comes too early is
		// refused, which the checker holds it to.
		time.Sleep(300 * time.Millisecond)
		if !viaAPI {
			time.Sleep(300 * time.Millisecond)
		}
		if sequential {
			refund(1, part)
			refund(2, b.Amount-part)
			refund(3, 1) // past the total: refused
			return
		}
		var wg sync.WaitGroup
		wg.Go(func() { refund(1, part) })
		wg.Go(func() { refund(2, part) })
		wg.Wait()
	})
}

// postUntilKnownAt posts payload to path of a region's API as post does,
// and again while the outcome is unknown or the key in flight (409
// idempotency_key_in_flight), up to maxRetries times through any region.
// It returns the outcome and the transfer the answer named (or, for an
// action, transfer[0]: the hold acted on).
func (e *env) postUntilKnownAt(ctx context.Context, purpose, via, key string, b Body, path string, payload []byte, transfer ...string) (Outcome, string) {
	o, status, id := e.postAt(ctx, purpose, via, key, b, path, payload, transfer...)
	for try := 1; (o == Unknown || status == http.StatusConflict && strings.Contains(id, string(api.CodeIdempotencyKeyInFlight))) && try <= maxRetries && ctx.Err() == nil; try++ {
		time.Sleep(time.Duration(try) * 250 * time.Millisecond)
		o, status, id = e.postAt(ctx, PurposeRetry, e.names[e.intn(len(e.names))], key, b, path, payload, transfer...)
	}
	return o, id
}

// postAt sends one POST of payload to path: 200, 201 and 202 are ok; a 5xx
// or no answer is unknown; any other 4xx is a fail. It returns the
// outcome, the status, and the ID the answer named (a problem's code for
// a 4xx).
func (e *env) postAt(ctx context.Context, purpose, via, key string, b Body, path string, payload []byte, transfer ...string) (Outcome, int, string) {
	e.sent.add(purpose)
	op := Op{Client: clientID, Key: key, Body: b, Path: "api", Via: via, Purpose: purpose, apiPath: path, payload: payload}
	if len(transfer) > 0 {
		op.Transfer = transfer[0]
	}
	i := e.hist.Invoke(op)
	r := e.c.Region(via)
	if r == nil {
		e.hist.Complete(i, Unknown, "region not running", "")
		return Unknown, 0, ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.APIURL+path, bytes.NewReader(payload))
	if err != nil {
		e.hist.Complete(i, Unknown, err.Error(), "")
		return Unknown, 0, ""
	}
	req.Header.Set("Authorization", "Bearer "+e.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := e.http.Do(req)
	if err != nil {
		e.hist.Complete(i, Unknown, err.Error(), "")
		return Unknown, 0, ""
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	detail := fmt.Sprintf("%d %s", res.StatusCode, strings.TrimSpace(string(raw)))
	switch {
	case res.StatusCode == http.StatusOK || res.StatusCode == http.StatusCreated || res.StatusCode == http.StatusAccepted:
		var t api.TransferBody
		_ = json.Unmarshal(raw, &t)
		e.hist.Complete(i, OK, fmt.Sprint(res.StatusCode), t.ID)
		return OK, res.StatusCode, t.ID
	case res.StatusCode >= 500:
		e.hist.Complete(i, Unknown, detail, "")
		return Unknown, res.StatusCode, ""
	}
	var p api.Problem
	_ = json.Unmarshal(raw, &p)
	if p.Code == api.CodeIdempotencyKeyInFlight && b.Type != ledger.TypeTransfer {
		// The key's request is still being decided: this op's outcome is
		// its, unknown here. (A plain transfer's 409 stays a fail, as the
		// scenarios' checks of conflicting bodies read it.)
		e.hist.Complete(i, Unknown, detail, "")
		return Unknown, res.StatusCode, string(p.Code)
	}
	e.hist.Complete(i, Fail, detail, "")
	return Fail, res.StatusCode, string(p.Code)
}

// action is a capture, void or account action as the checker reads it
// (transfer: the hold acted on, or the account).
type action struct {
	region, client, key, transfer, typ, status string
	amount                                     int64
}

func readActions(ctx context.Context, c *cluster.Cluster) ([]action, error) {
	var out []action
	for _, n := range sortedNames(c) {
		rows, err := c.Region(n).Ledger.Store.Pool().Query(ctx, `
			SELECT client_id, idempotency_key, transfer_id, type, amount, status FROM transfer_actions
			UNION ALL
			SELECT client_id, idempotency_key, account_id, type, 0, status FROM account_actions`)
		if err != nil {
			return nil, fmt.Errorf("read actions of %s: %w", n, err)
		}
		as, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (action, error) {
			a := action{region: n}
			err := r.Scan(&a.client, &a.key, &a.transfer, &a.typ, &a.amount, &a.status)
			return a, err
		})
		if err != nil {
			return nil, fmt.Errorf("read actions of %s: %w", n, err)
		}
		out = append(out, as...)
	}
	return out, nil
}

// isAction reports whether an op is a capture, void or account action
// (checked by checkActions, not against transfer rows).
func isAction(op Op) bool {
	return ledger.Command{Type: op.Body.Type}.IsKeyedAction()
}

// checkActions is I3 for captures, voids and account actions: per key, an
// acknowledged one applied (its record APPLIED, on the hold or account it
// named), a refused one did not, and every record answers a request of the
// history. It returns how
// many acknowledged ones were lost.
func checkActions(ops []Op, actions []action, chk *Check) (lost int) {
	byKey := map[clientKey][]Op{}
	var keys []clientKey
	for _, op := range ops {
		if !isAction(op) {
			continue
		}
		k := clientKey{op.Client, op.Key}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	recs := map[clientKey]action{}
	for _, a := range actions {
		k := clientKey{a.client, a.key}
		if _, ok := byKey[k]; !ok {
			chk.fail("%s %s/%s of %s (in %s) was sent by no request of the history", a.typ, a.client, a.key, a.transfer, a.region)
			continue
		}
		if prev, dup := recs[k]; dup {
			chk.fail("%s %s/%s DOUBLED: recorded in %s and %s", a.typ, a.client, a.key, prev.region, a.region)
		}
		recs[k] = a
	}
	for _, k := range keys {
		chk.Checked++
		kops := byKey[k]
		acked := false
		for _, op := range kops {
			acked = acked || op.Outcome == OK
		}
		a, ok := recs[k]
		name := k.client + "/" + k.key
		switch {
		case acked && (!ok || a.status != string(ledger.ActionApplied)):
			lost++
			chk.fail("%s %s LOST: acknowledged (%s) but not applied (record %q)", kops[0].Body.Type, name, describe(kops), a.status)
		case !acked && ok && a.status == string(ledger.ActionApplied) && allFailed(kops):
			chk.fail("%s %s applied, but every request of it was refused (%s)", kops[0].Body.Type, name, describe(kops))
		case ok && (a.transfer != kops[0].Transfer || a.typ != kops[0].Body.Type):
			chk.fail("%s %s: its record is a %s of %s, the request a %s of %s", kops[0].Body.Type, name, a.typ, a.transfer, kops[0].Body.Type, kops[0].Transfer)
		case ok && a.status == string(ledger.ActionApplied) && a.typ == ledger.TypeCapture && kops[0].Body.Amount > 0 && a.amount != kops[0].Body.Amount:
			chk.fail("capture %s captured %d, the request asked for %d", name, a.amount, kops[0].Body.Amount)
		}
	}
	return lost
}

func allFailed(ops []Op) bool {
	for _, op := range ops {
		if op.Outcome != Fail {
			return false
		}
	}
	return true
}

// flowStats counts, over every region, how the run's holds ended and what
// became of its refunds and actions, into stats: the report shows that the
// workload exercised each.
func (e *env) flowStats(ctx context.Context, stats map[string]int64) error {
	for _, n := range e.names {
		rows, err := e.c.Region(n).Ledger.Store.Pool().Query(ctx, `
			SELECT 'holds_' || lower(status), count(*) FROM transfers WHERE expires_at IS NOT NULL GROUP BY status
			UNION ALL
			SELECT 'refunds_' || lower(status), count(*) FROM transfers WHERE type = 'refund' GROUP BY status
			UNION ALL
			SELECT type || 's_' || lower(status), count(*) FROM transfer_actions GROUP BY type, status
			UNION ALL
			SELECT type || 's_' || lower(status), count(*) FROM account_actions GROUP BY type, status
			UNION ALL
			SELECT 'refused_closed_' || lower(status), count(*) FROM transfers WHERE reason = 'account_closed' GROUP BY status`)
		if err != nil {
			return err
		}
		var name string
		var count int64
		if _, err := pgx.ForEachRow(rows, []any{&name, &count}, func() error { stats[name] += count; return nil }); err != nil {
			return err
		}
	}
	return nil
}
