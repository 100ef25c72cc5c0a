// Package hookaudit checks a webhook endpoint end to end, for the lab's
// runs (chaos, demo, sim): it reads every region's events of a client and
// their deliveries to the endpoint, and the reference receiver's database
// (services/receiver), and says whether every event's effect happened at
// the receiver exactly once, and none was lost: each applied, or its
// delivery failed at paymesh with its attempts recorded.
package hookaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/receiver"
)

// Region is one region's database.
type Region struct {
	Name string
	Pool *pgxpool.Pool
}

// Target is what is audited: a client's events in every region, their
// deliveries to one endpoint, and the receiver's database.
type Target struct {
	Regions  []Region
	Client   string
	Endpoint string
	Receiver *pgxpool.Pool
}

// MaxListed bounds the failures an Audit lists (all are counted).
const MaxListed = 20

// Audit is what the audit found.
type Audit struct {
	// Events is the client's events in every region; Delivered, Failed
	// and Waiting their deliveries (waiting: pending, or not yet queued);
	// Attempts the attempts sent for them.
	Events, Delivered, Failed, Waiting, Attempts int64
	// Applied and Parked are the receiver's events; Effects the events its
	// orders and accounts count as applied to them.
	Applied, Parked, Effects int64
	// Duplicates is the duplicates the receiver recorded, by cause.
	Duplicates map[receiver.Cause]int64
	// Lost counts the events lost (neither applied nor failed at paymesh)
	// and the rows with fewer effects than events applied to them, Doubled
	// the rows with more (or another refunded total) and the events
	// recorded that no region has. Unapplied lists the lost events and
	// Mismatch the rows (at most MaxListed each), each by name.
	Lost, Doubled       int64
	Unapplied, Mismatch []string
}

// OK reports whether nothing was lost or doubled.
func (a Audit) OK() bool { return a.Lost == 0 && a.Doubled == 0 }

// Duplicated is the duplicates the receiver recorded, all causes.
func (a Audit) Duplicated() int64 {
	var n int64
	for _, v := range a.Duplicates {
		n += v
	}
	return n
}

// ByCause describes the duplicates by cause, in receiver.Causes' order:
// "retry 3, redelivery 1, parked 0, stale 0, unknown 0".
func (a Audit) ByCause() string {
	var out []string
	for _, c := range receiver.Causes() {
		out = append(out, fmt.Sprintf("%s %d", c, a.Duplicates[c]))
	}
	return strings.Join(out, ", ")
}

// list appends a failure to l, up to MaxListed.
func list(l *[]string, format string, args ...any) {
	if len(*l) < MaxListed {
		*l = append(*l, fmt.Sprintf(format, args...))
	}
}

// event is one event of the client as its region recorded it, and what
// became of its delivery there.
type event struct {
	id, typ string
	// target is the row its effect changes at the receiver: the order (a
	// transfer's ID; for a refund, the transfer it refunds) or the account;
	// none for an endpoint's event.
	target string
	// refund is a completed refund's amount.
	refund int64
	// status and attempts are its delivery's ("" when none was queued).
	status   string
	attempts int64
}

// eventsSQL reads a region's events of a client with their delivery to an
// endpoint.
const eventsSQL = `
	SELECT e.account_id || '.' || e.sequence, e.type,
	       CASE WHEN e.type LIKE 'account.%' THEN e.account_id WHEN e.type LIKE 'webhook_endpoint.%' THEN ''
	            ELSE coalesce(t.refund_of, e.object_id) END,
	       CASE WHEN e.type = 'refund.completed' THEN coalesce(t.amount, 0) ELSE 0 END,
	       coalesce(d.status, ''), coalesce(d.attempts, 0)
	FROM events e
	LEFT JOIN transfers t ON t.id = e.object_id AND (e.type LIKE 'transfer.%' OR e.type LIKE 'refund.%')
	LEFT JOIN webhook_deliveries d ON d.endpoint_id = $2 AND d.account_id = e.account_id AND d.sequence = e.sequence
	WHERE e.client_id = $1`

func (t Target) events(ctx context.Context) ([]event, error) {
	var out []event
	for _, r := range t.Regions {
		rows, _ := r.Pool.Query(ctx, eventsSQL, t.Client, t.Endpoint)
		evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (event, error) {
			var ev event
			err := row.Scan(&ev.id, &ev.typ, &ev.target, &ev.refund, &ev.status, &ev.attempts)
			return ev, err
		})
		if err != nil {
			return nil, fmt.Errorf("events of %s: %w", r.Name, err)
		}
		out = append(out, evs...)
	}
	return out, nil
}

// Drain waits until every event's delivery has ended (delivered or
// failed), or until nothing has changed for quiet (a stuck delivery: the
// audit says which), for at most bound. It returns ctx's error if ctx
// ends first.
func (t Target) Drain(ctx context.Context, quiet, bound time.Duration) error {
	var last string
	changed := time.Now()
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); {
		evs, err := t.events(ctx)
		if err == nil {
			waiting := 0
			for _, ev := range evs {
				if ev.status == "" || ev.status == "pending" {
					waiting++
				}
			}
			if waiting == 0 {
				return nil
			}
			var applied int64
			_ = t.Receiver.QueryRow(ctx, `SELECT count(*) FROM receiver_events`).Scan(&applied)
			if now := fmt.Sprint(waiting, applied); now != last {
				last, changed = now, time.Now()
			} else if time.Since(changed) > quiet {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// receiverState is what the receiver's database holds: each event's
// state, each order's and account's effects, and the duplicates.
type receiverState struct {
	state      map[string]string // event ID -> parked, applied
	effects    map[string]int64  // order or account -> events applied to it
	refunded   map[string]int64  // order -> refunded total
	duplicates map[receiver.Cause]int64
}

func (t Target) receiverState(ctx context.Context) (receiverState, error) {
	s := receiverState{state: map[string]string{}, effects: map[string]int64{}, refunded: map[string]int64{}, duplicates: map[receiver.Cause]int64{}}
	var id, v string
	var n, r int64
	rows, _ := t.Receiver.Query(ctx, `SELECT event_id, state FROM receiver_events`)
	if _, err := pgx.ForEachRow(rows, []any{&id, &v}, func() error { s.state[id] = v; return nil }); err != nil {
		return s, err
	}
	rows, _ = t.Receiver.Query(ctx, `SELECT cause, count(*) FROM receiver_duplicates GROUP BY cause`)
	if _, err := pgx.ForEachRow(rows, []any{&v, &n}, func() error { s.duplicates[receiver.Cause(v)] = n; return nil }); err != nil {
		return s, err
	}
	rows, _ = t.Receiver.Query(ctx, `SELECT transfer_id, events, refunded FROM orders UNION ALL SELECT account, events, 0 FROM customer_accounts`)
	_, err := pgx.ForEachRow(rows, []any{&id, &n, &r}, func() error { s.effects[id], s.refunded[id] = n, r; return nil })
	return s, err
}

// Run audits the target: call it once the deliveries have drained.
func (t Target) Run(ctx context.Context) (Audit, error) {
	evs, err := t.events(ctx)
	if err != nil {
		return Audit{}, err
	}
	rs, err := t.receiverState(ctx)
	if err != nil {
		return Audit{}, fmt.Errorf("the receiver's state: %w", err)
	}
	a := Audit{Events: int64(len(evs)), Duplicates: rs.duplicates}
	wantFx, wantRefund := map[string]int64{}, map[string]int64{}
	known := map[string]bool{}
	for _, ev := range evs {
		known[ev.id] = true
		a.Attempts += ev.attempts
		switch ev.status {
		case "delivered":
			a.Delivered++
		case "failed":
			a.Failed++
		default:
			a.Waiting++
		}
		switch st := rs.state[ev.id]; {
		case st == "applied" && ev.target == "": // an endpoint's event: no order's or account's
		case st == "applied":
			wantFx[ev.target]++
			wantRefund[ev.target] += ev.refund
		case ev.status == "failed" && ev.attempts > 0:
		case st == "parked":
			a.Lost++
			list(&a.Unapplied, "LOST %s (%s): parked at the receiver, an earlier event of its account never came", ev.id, ev.typ)
		case ev.status == "delivered":
			a.Lost++
			list(&a.Unapplied, "LOST %s (%s): delivered (answered 2xx, %d attempts), never applied at the receiver", ev.id, ev.typ, ev.attempts)
		default:
			a.Lost++
			list(&a.Unapplied, "LOST %s (%s): its delivery is %q after %d attempts, the receiver has none of it", ev.id, ev.typ, ev.status, ev.attempts)
		}
	}
	for id, st := range rs.state {
		if st == "applied" {
			a.Applied++
		} else {
			a.Parked++
		}
		if !known[id] {
			a.Doubled++
			list(&a.Mismatch, "%s is recorded at the receiver, but no region recorded that event", id)
		}
	}
	a.compareEffects(rs, wantFx, wantRefund)
	return a, nil
}

// compareEffects checks each row's effects and refunded total against the
// events recorded as applied to it.
func (a *Audit) compareEffects(rs receiverState, wantFx, wantRefund map[string]int64) {
	for target, got := range rs.effects {
		a.Effects += got
		switch want := wantFx[target]; {
		case got > want:
			a.Doubled++
			list(&a.Mismatch, "DOUBLED %s: %d effects for %d events applied", target, got, want)
		case got < want:
			a.Lost++
			list(&a.Mismatch, "LOST effect %s: %d effects for %d events recorded as applied", target, got, want)
		case rs.refunded[target] != wantRefund[target]:
			a.Doubled++
			list(&a.Mismatch, "%s: refunded %d, its completed refunds applied come to %d", target, rs.refunded[target], wantRefund[target])
		}
	}
	for target, want := range wantFx {
		if _, ok := rs.effects[target]; !ok {
			a.Lost++
			list(&a.Mismatch, "LOST effect %s: no effect for %d events recorded as applied", target, want)
		}
	}
}

// WaitCopies waits, up to bound, until every region holds the endpoint, so
// that no region's events are left out; it returns an error naming the
// region that does not.
func (t Target) WaitCopies(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for _, r := range t.Regions {
		for {
			var n int
			err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE id = $1`, t.Endpoint).Scan(&n)
			if err == nil && n == 1 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the endpoint %s never reached %s (%v)", t.Endpoint, r.Name, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// CreateEndpoint creates, through cl, an endpoint at url for every event
// type under the Idempotency-Key key, and returns it with its secret; an
// answer that is not 2xx is an error that quotes it.
func CreateEndpoint(ctx context.Context, cl *api.Client, url, key string) (api.WebhookEndpointBody, error) {
	var ep api.WebhookEndpointBody
	r, err := cl.CreateWebhookEndpoint(ctx, api.WebhookEndpointRequest{URL: url}, key)
	switch {
	case err != nil:
		return ep, fmt.Errorf("create the webhook endpoint: %w", err)
	case r.Status/100 != 2:
		return ep, fmt.Errorf("create the webhook endpoint: answered %d: %s", r.Status, r.Body)
	}
	if err := json.Unmarshal(r.Body, &ep); err != nil {
		return ep, fmt.Errorf("create the webhook endpoint: %w", err)
	}
	return ep, nil
}

// Redeliver asks paymesh, through cl (an API of the client's), to send
// again one in oneIn of the client's events in every region, as a client
// would after losing its own record, and returns how many it asked for:
// each must come to the receiver as a duplicate (cause redelivery), and
// none be applied again. It asks only for events the receiver has already
// recorded: one still on its way (a delivery waiting for its retry) would
// reach the receiver first as the redelivered copy, which is then no
// duplicate.
func (t Target) Redeliver(ctx context.Context, cl *api.Client, oneIn int) (int64, error) {
	rows, _ := t.Receiver.Query(ctx, `SELECT account || '.' || sequence FROM receiver_events`)
	recorded, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("the receiver's events: %w", err)
	}
	have := make(map[string]bool, len(recorded))
	for _, id := range recorded {
		have[id] = true
	}
	var ids []string
	for _, r := range t.Regions {
		rows, _ := r.Pool.Query(ctx, `SELECT account_id || '.' || sequence FROM events
			WHERE client_id = $1 AND (hashtext(account_id) + sequence) % $2 = 0`, t.Client, oneIn)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, fmt.Errorf("events of %s: %w", r.Name, err)
		}
		for _, id := range got {
			if have[id] {
				ids = append(ids, id)
			}
		}
	}
	var n int64
	for _, id := range ids {
		r, err := cl.PostOnce(ctx, "/v1/events/"+id+"/redeliver", nil)
		if err != nil || r.Status != http.StatusAccepted {
			return n, fmt.Errorf("redeliver %s: %v %d %s", id, err, r.Status, r.Body)
		}
		n++
	}
	return n, nil
}
