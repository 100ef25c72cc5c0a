package chaos

import (
	"context"
	"time"

	"github.com/paymesh/paymesh/internal/lab/hookaudit"
	"github.com/paymesh/paymesh/services/receiver"
)

// target is what the webhook checks audit: the workload client's events in
// every region, their deliveries to the run's endpoint, the receiver.
func (h *hookRun) target() hookaudit.Target {
	t := hookaudit.Target{Client: clientID, Endpoint: h.endpoint, Receiver: h.pool}
	for _, n := range h.e.names {
		t.Regions = append(t.Regions, hookaudit.Region{Name: n, Pool: h.e.c.Region(n).Ledger.Store.Pool()})
	}
	return t
}

// checkHooks drains the deliveries (until none changes for 8 s, at most 2
// minutes) and audits the receiver: no event lost (applied, or failed at
// paymesh with its attempts), and every effect applied once (each order's
// and account's effects and refunded total are those of the events
// recorded as applied).
func (h *hookRun) checkHooks(ctx context.Context, e *env) ([]Check, error) {
	t := h.target()
	if err := t.Drain(ctx, 8*time.Second, 2*time.Minute); err != nil {
		return nil, err
	}
	a, err := t.Run(ctx)
	if err != nil {
		return nil, err
	}
	lost := Check{Name: "hooks-lost", What: "every event of the client was applied at the receiver, or its delivery failed with its attempts recorded",
		OK: len(a.Unapplied) == 0, Checked: a.Events, Failures: a.Unapplied}
	once := Check{Name: "hooks-once", What: "every event's effect happened at the receiver exactly once (each order's and account's effects and refunds)",
		OK: len(a.Mismatch) == 0, Checked: a.Applied, Failures: a.Mismatch}
	for k, v := range map[string]int64{"hook_events": a.Events, "hook_delivered": a.Delivered, "hook_attempts": a.Attempts,
		"hook_applied": a.Applied, "hook_effects": a.Effects} {
		e.events.addN(k, v)
	}
	for _, c := range receiver.Causes() {
		e.events.addN("hook_duplicates_"+string(c), a.Duplicates[c])
	}
	return []Check{lost, once}, nil
}
