package receiver

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Gap is an account whose events wait for an earlier one that has not
// arrived: Next is the missing sequence, Parked how many wait, from
// FirstParked, the oldest since Since.
type Gap struct {
	Account     string    `json:"account"`
	Next        int64     `json:"next"`
	Parked      int64     `json:"parked"`
	FirstParked int64     `json:"first_parked"`
	Since       time.Time `json:"since"`
}

// Gaps returns the accounts whose oldest parked event has waited longer
// than olderThan, oldest first. paymesh sends an account's events in
// order, one at a time, so a gap that lasts means an event that failed for
// good at paymesh (see its attempts), or an endpoint whose feed starts
// after the account's first event: an operator looks.
func (r *Receiver) Gaps(ctx context.Context, olderThan time.Duration) ([]Gap, error) {
	rows, _ := r.cfg.DB.Query(ctx, `
		SELECT a.account, a.next_sequence, count(*), min(e.sequence), min(e.received_at)
		FROM receiver_events e JOIN receiver_accounts a ON a.account = e.account
		WHERE e.state = 'parked'
		GROUP BY a.account, a.next_sequence
		HAVING min(e.received_at) < now() - $1::bigint * interval '1 microsecond'
		ORDER BY min(e.received_at)`, olderThan.Microseconds())
	gaps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Gap])
	if err != nil {
		return nil, fmt.Errorf("receiver gaps: %w", err)
	}
	return gaps, nil
}

// Totals is what the receiver's database holds: events applied and
// parked, duplicates by cause, and the effects applied (the events counts
// of the orders and accounts: equal to Applied unless an effect was
// applied twice, or without its event's record).
type Totals struct {
	Applied, Parked int64
	Duplicates      map[Cause]int64
	Effects         int64
}

// Totals reads the receiver's totals.
func (r *Receiver) Totals(ctx context.Context) (Totals, error) {
	t := Totals{Duplicates: map[Cause]int64{}}
	rows, _ := r.cfg.DB.Query(ctx, `
		SELECT 'state', state, count(*) FROM receiver_events GROUP BY state
		UNION ALL SELECT 'cause', cause, count(*) FROM receiver_duplicates GROUP BY cause
		UNION ALL SELECT 'effects', 'orders', coalesce(sum(events), 0) FROM orders
		UNION ALL SELECT 'effects', 'accounts', coalesce(sum(events), 0) FROM customer_accounts`)
	var kind, name string
	var n int64
	_, err := pgx.ForEachRow(rows, []any{&kind, &name, &n}, func() error {
		switch kind {
		case "state":
			if name == string(Applied) {
				t.Applied = n
			} else {
				t.Parked = n
			}
		case "cause":
			t.Duplicates[Cause(name)] = n
		default:
			t.Effects += n
		}
		return nil
	})
	if err != nil {
		return Totals{}, fmt.Errorf("receiver totals: %w", err)
	}
	return t, nil
}
