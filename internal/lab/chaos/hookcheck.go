package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/receiver"
)

// hookEvent is one event of the workload client as its region recorded
// it, and what became of its delivery there.
type hookEvent struct {
	id, typ string
	// target is the row its effect changes at the receiver: the order (a
	// transfer's ID; for a refund, the transfer it refunds) or the account.
	target string
	// refund is a completed refund's amount.
	refund int64
	// status and attempts are its delivery's ("" when none was queued).
	status   string
	attempts int
}

// hookEventsSQL reads a region's events of a client with their delivery to
// an endpoint.
const hookEventsSQL = `
	SELECT e.account_id || '.' || e.sequence, e.type,
	       CASE WHEN e.type LIKE 'account.%' THEN e.account_id ELSE coalesce(t.refund_of, e.object_id) END,
	       CASE WHEN e.type = 'refund.completed' THEN coalesce(t.amount, 0) ELSE 0 END,
	       coalesce(d.status, ''), coalesce(d.attempts, 0)
	FROM events e
	LEFT JOIN transfers t ON t.id = e.object_id AND e.type NOT LIKE 'account.%'
	LEFT JOIN webhook_deliveries d ON d.endpoint_id = $2 AND d.account_id = e.account_id AND d.sequence = e.sequence
	WHERE e.client_id = $1`

func (h *hookRun) events(ctx context.Context) ([]hookEvent, error) {
	var out []hookEvent
	for _, n := range h.e.names {
		rows, _ := h.e.c.Region(n).Ledger.Store.Pool().Query(ctx, hookEventsSQL, clientID, h.endpoint)
		evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (hookEvent, error) {
			var ev hookEvent
			err := row.Scan(&ev.id, &ev.typ, &ev.target, &ev.refund, &ev.status, &ev.attempts)
			return ev, err
		})
		if err != nil {
			return nil, fmt.Errorf("events of %s: %w", n, err)
		}
		out = append(out, evs...)
	}
	return out, nil
}

// drain waits until no delivery is pending and every event is queued, or
// until nothing has changed for 15 s (a stuck delivery: the checks say
// which), for at most bound.
func (h *hookRun) drain(ctx context.Context, bound time.Duration) {
	var last string
	changed := time.Now()
	for deadline := time.Now().Add(bound); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		evs, err := h.events(ctx)
		if err != nil {
			continue
		}
		waiting := 0
		for _, ev := range evs {
			if ev.status == "" || ev.status == "pending" {
				waiting++
			}
		}
		if waiting == 0 {
			return
		}
		tot, _ := h.recv.Load().Totals(ctx) // progress: applied or parked
		if now := fmt.Sprint(waiting, tot.Applied, tot.Parked); now != last {
			last, changed = now, time.Now()
		} else if time.Since(changed) > 15*time.Second {
			return
		}
	}
}

// receiverState is what the receiver's database holds: each event's
// state, and each order's and account's effects.
type receiverState struct {
	state    map[string]string // event ID -> parked, applied
	effects  map[string]int64  // order or account -> events applied to it
	refunded map[string]int64  // order -> refunded total
}

func (h *hookRun) receiverState(ctx context.Context) (receiverState, error) {
	s := receiverState{state: map[string]string{}, effects: map[string]int64{}, refunded: map[string]int64{}}
	var id, v string
	var n, r int64
	rows, _ := h.pool.Query(ctx, `SELECT event_id, state FROM receiver_events`)
	if _, err := pgx.ForEachRow(rows, []any{&id, &v}, func() error { s.state[id] = v; return nil }); err != nil {
		return s, err
	}
	rows, _ = h.pool.Query(ctx, `SELECT transfer_id, events, refunded FROM orders UNION ALL SELECT account, events, 0 FROM customer_accounts`)
	_, err := pgx.ForEachRow(rows, []any{&id, &n, &r}, func() error { s.effects[id], s.refunded[id] = n, r; return nil })
	return s, err
}

// checkHooks drains the deliveries and checks the receiver: no event lost
// (applied, or failed at paymesh with its attempts), and every effect
// applied once (each order's and account's effects and refunded total are
// those of the events recorded as applied).
func (h *hookRun) checkHooks(ctx context.Context, e *env) ([]Check, error) {
	h.drain(ctx, 2*time.Minute)
	evs, err := h.events(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := h.receiverState(ctx)
	if err != nil {
		return nil, fmt.Errorf("the receiver's state: %w", err)
	}
	lost := Check{Name: "hooks-lost", What: "every event of the client was applied at the receiver, or its delivery failed with its attempts recorded", OK: true}
	once := Check{Name: "hooks-once", What: "every event's effect happened at the receiver exactly once (each order's and account's effects and refunds)", OK: true}
	wantFx, wantRefund := map[string]int64{}, map[string]int64{}
	known := map[string]bool{}
	for _, ev := range evs {
		lost.Checked++
		known[ev.id] = true
		switch st := rs.state[ev.id]; {
		case st == "applied":
			wantFx[ev.target]++
			wantRefund[ev.target] += ev.refund
		case ev.status == "failed" && ev.attempts > 0:
		case st == "parked":
			lost.fail("LOST %s (%s): parked at the receiver, an earlier event of its account never came", ev.id, ev.typ)
		case ev.status == "delivered":
			lost.fail("LOST %s (%s): delivered (answered 2xx, %d attempts), never applied at the receiver", ev.id, ev.typ, ev.attempts)
		default:
			lost.fail("LOST %s (%s): its delivery is %q after %d attempts, the receiver has none of it", ev.id, ev.typ, ev.status, ev.attempts)
		}
	}
	for id := range rs.state {
		if !known[id] {
			once.fail("%s is recorded at the receiver, but no region recorded that event", id)
		}
	}
	for target, got := range rs.effects {
		once.Checked++
		switch want := wantFx[target]; {
		case got > want:
			once.fail("DOUBLED %s: %d effects for %d events applied", target, got, want)
		case got < want:
			once.fail("LOST effect %s: %d effects for %d events recorded as applied", target, got, want)
		case rs.refunded[target] != wantRefund[target]:
			once.fail("%s: refunded %d, its completed refunds applied come to %d", target, rs.refunded[target], wantRefund[target])
		}
	}
	for target, want := range wantFx {
		if _, ok := rs.effects[target]; !ok {
			once.fail("LOST effect %s: no effect for %d events recorded as applied", target, want)
		}
	}
	return []Check{lost, once}, h.report(ctx, e, evs)
}

// report adds what the deliveries and the receiver did to the run's
// stats, the receiver's from its database (a crash takes its in-memory
// counts with it).
func (h *hookRun) report(ctx context.Context, e *env, evs []hookEvent) error {
	e.events.addN("hook_events", int64(len(evs)))
	for _, ev := range evs {
		e.events.addN("hook_attempts", int64(ev.attempts))
		if ev.status == "delivered" {
			e.events.addN("hook_delivered", 1)
		}
	}
	tot, err := h.recv.Load().Totals(ctx)
	if err != nil {
		return err
	}
	e.events.addN("hook_applied", tot.Applied)
	e.events.addN("hook_effects", tot.Effects)
	for _, c := range receiver.Causes() {
		e.events.addN("hook_duplicates_"+string(c), tot.Duplicates[c])
	}
	return nil
}

// decodeBody reads a 2xx answer's JSON body into v.
func decodeBody(r api.Response, v any) error {
	if r.Status/100 != 2 {
		return fmt.Errorf("answered %d: %s", r.Status, r.Body)
	}
	return json.Unmarshal(r.Body, v)
}
