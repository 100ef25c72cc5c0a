package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// Flows is what the demo's holds and refunds did, and what went wrong: a
// request answered other than the documented way.
type Flows struct {
	Holds, Captured, CapturedInPart, Voided, LeftToExpire, Expired int64
	// LateRefused counts the voids sent after a capture, and captures
	// after a void or the expiry, each refused 409 transfer_not_held (or
	// hold_expired).
	LateRefused int64
	// Refunded counts the transfers refunded, Twice those refunded in two
	// parts, PastTotal the refunds past what was left, each refused 422
	// refund_exceeds_captured.
	Refunded, Twice, PastTotal int64
	// Replayed counts the captures sent again with their key (in another
	// region), each answered with the first answer.
	Replayed int64
	Problems []string
}

// OK reports whether every answer was the documented one and every hold
// left alone expired.
func (f Flows) OK() bool { return len(f.Problems) == 0 && f.Expired == f.LeftToExpire }

// holdLife is how long the holds the demo leaves alone last.
const holdLife = 2 * time.Second

// heldOrExpired reports whether a hold's status is HELD or, for a hold
// left to expire, EXPIRED.
func heldOrExpired(status string, expires bool) bool {
	return status == string(ledger.StatusHeld) || (expires && status == string(ledger.StatusExpired))
}

// flows runs, through the HTTP APIs of random regions, holds of the demo's
// transfers: captured (a third of them in part), voided, or left to
// expire, with a late void or capture refused and some captures sent again;
// then refunds of completed transfers by their payee: in part, half of them
// twice, then once more past the total. The ledger records each hold and
// refund as a transfer, counted in d.commands.
func (d *driver) flows(ctx context.Context, holds, refunds int) (Flows, error) {
	var f Flows
	var mu sync.Mutex
	problem := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(f.Problems) < 20 {
			f.Problems = append(f.Problems, fmt.Sprintf(format, args...))
		}
	}
	count := func(n *int64) { mu.Lock(); *n++; mu.Unlock() }
	client := func() *api.Client { return d.apiClient(d.names[d.intn(len(d.names))]) }
	// refused checks that a request was refused with one of codes.
	refused := func(what string, r api.Response, err error, codes ...ledger.Code) bool {
		var e *api.Error
		if errors.As(err, &e) {
			for _, c := range codes {
				if e.Problem.Code == c {
					return true
				}
			}
		}
		problem("%s: got %d %s, want %v", what, r.Status, r.Body, codes)
		return false
	}
	var expiring []string
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				from, to := d.pair()
				amount := 100 + int64(d.intn(5000))
				req := api.TransferRequest{From: from, To: to, Amount: amount, Currency: "EUR", Hold: true}
				kind := i % 3 // capture, void, left to expire
				if kind == 2 {
					at := time.Now().Add(holdLife)
					req.ExpiresAt = &at
				}
				mu.Lock()
				d.commands++
				mu.Unlock()
				key := fmt.Sprintf("h-%d-%d", d.cfg.Seed, i)
				r, err := client().SendTransfer(ctx, req, key)
				// A 202 is the API's provisional answer when its wait ran
				// out (a loaded machine), and a retry replays it: the
				// client reads the hold until it is applied.
				var pending api.TransferBody
				if err == nil && r.Status == http.StatusAccepted && json.Unmarshal(r.Body, &pending) == nil && pending.ID != "" {
					for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
						if got, gerr := client().Get(ctx, "/v1/transfers/"+pending.ID); gerr == nil { // recorded: HELD, or refused
							r = got
							break
						}
					}
				}
				var h api.TransferBody
				// A hold left to expire may be read EXPIRED already: on a
				// loaded machine its answer (or the read after a 202) can
				// come after its expiry, which only a held hold reaches.
				if err != nil || json.Unmarshal(r.Body, &h) != nil || !heldOrExpired(h.Status, kind == 2) {
					problem("hold %s: %d %s (%v), want 201 HELD", key, r.Status, r.Body, err)
					continue
				}
				count(&f.Holds)
				switch kind {
				case 0:
					part := i%2 == 1
					n := int64(0)
					if part {
						n = amount / 3
					}
					ck := key + "-capture"
					r, err := client().Capture(ctx, h.ID, n, ck)
					var c api.TransferBody
					if err != nil || json.Unmarshal(r.Body, &c) != nil || c.CapturedAmount == nil || (part && *c.CapturedAmount != n) {
						problem("capture %s: %d %s (%v)", ck, r.Status, r.Body, err)
						continue
					}
					count(&f.Captured)
					if part {
						count(&f.CapturedInPart)
					}
					if d.float() < 0.5 { // the client lost the answer and sends it again, elsewhere
						again, err := client().Capture(ctx, h.ID, n, ck)
						if err != nil || !again.Replayed || string(again.Body) != string(r.Body) {
							problem("capture %s again: %d %s (replayed %t, %v), want the first answer", ck, again.Status, again.Body, again.Replayed, err)
						} else {
							count(&f.Replayed)
						}
					}
					r, err = client().Void(ctx, h.ID, key+"-void")
					if refused("void after capture "+key, r, err, ledger.CodeTransferNotHeld) {
						count(&f.LateRefused)
					}
				case 1:
					r, err := client().Void(ctx, h.ID, key+"-void")
					if err != nil || r.Status != http.StatusOK {
						problem("void %s: %d %s (%v)", key, r.Status, r.Body, err)
						continue
					}
					count(&f.Voided)
					r, err = client().Capture(ctx, h.ID, 0, key+"-capture")
					if refused("capture after void "+key, r, err, ledger.CodeTransferNotHeld) {
						count(&f.LateRefused)
					}
				default:
					mu.Lock()
					f.LeftToExpire++
					expiring = append(expiring, h.ID)
					mu.Unlock()
				}
			}
		})
	}
	for i := range holds {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return f, err
	}
	// The holds left alone expire (the relay sends their expiry steps once
	// due): wait for them, then check each.
	select {
	case <-time.After(holdLife + 500*time.Millisecond):
	case <-ctx.Done():
		return f, ctx.Err()
	}
	if err := d.waitQuiet(ctx); err != nil {
		return f, err
	}
	for _, id := range expiring {
		home, _ := d.c.IDs().HomeRegion(id)
		t, err := d.c.Region(home).Ledger.Store.Transfer(ctx, id)
		if err == nil && t.Status == ledger.StatusExpired {
			f.Expired++
			continue
		}
		problem("hold %s left alone: %s (%v), want EXPIRED", id, t.Status, err)
		r, err := client().Capture(ctx, id, 0, "late-"+id)
		refused("capture after expiry "+id, r, err, ledger.CodeTransferNotHeld, ledger.CodeHoldExpired)
	}
	d.refunds(ctx, refunds, &f, &mu, problem, refused, count)
	return f, d.waitQuiet(ctx)
}

// refunds has the payees of n completed transfers refund them: a part,
// half of them the rest too, then one more unit, refused.
func (d *driver) refunds(ctx context.Context, n int, f *Flows, mu *sync.Mutex, problem func(string, ...any),
	refused func(string, api.Response, error, ...ledger.Code) bool, count func(*int64)) {
	var done int
	for _, cmd := range d.cmds {
		if done == n || ctx.Err() != nil {
			return
		}
		home, _ := d.c.IDs().HomeRegion(cmd.From)
		t, err := d.c.Region(home).Ledger.Store.Transfer(ctx, cmd.TransferID)
		if err != nil || t.Status != ledger.StatusCompleted || t.Amount < 2 {
			continue
		}
		done++
		cl := d.apiClient(d.names[d.intn(len(d.names))])
		part := t.Amount / 2
		twice := done%2 == 0
		steps := []int64{part}
		if twice {
			steps = append(steps, t.Amount-part)
		}
		ok := true
		for k, amount := range steps {
			mu.Lock()
			d.commands++ // each refund is recorded, a refused one too
			mu.Unlock()
			r, err := cl.Refund(ctx, t.ID, amount, fmt.Sprintf("r-%s-%d", t.ID, k))
			var rb api.TransferBody
			switch {
			case err == nil && r.Status == http.StatusAccepted: // still on its way to the payer's region
			case err != nil || json.Unmarshal(r.Body, &rb) != nil || rb.RefundOf != t.ID || rb.Amount != amount:
				problem("refund %d of %s: %d %s (%v)", k+1, t.ID, r.Status, r.Body, err)
				ok = false
			}
		}
		if !ok {
			continue
		}
		mu.Lock()
		d.commands++ // the refund past the total
		mu.Unlock()
		count(&f.Refunded)
		if twice {
			count(&f.Twice)
		}
		left := t.Amount - part
		if twice {
			left = 0
		}
		r, err := cl.Refund(ctx, t.ID, left+1, fmt.Sprintf("r-%s-past", t.ID))
		if refused("refund past the total of "+t.ID, r, err, ledger.CodeRefundExceedsCaptured) {
			count(&f.PastTotal)
		}
	}
}

// pair draws a source and a destination account, half of the time in two
// regions.
func (d *driver) pair() (string, string) {
	src := d.names[d.intn(len(d.names))]
	dst := src
	if d.float() < 0.5 {
		for dst == src {
			dst = d.names[d.intn(len(d.names))]
		}
	}
	from := d.accounts[src][d.intn(len(d.accounts[src]))]
	to := from
	for to == from {
		to = d.accounts[dst][d.intn(len(d.accounts[dst]))]
	}
	return from, to
}
