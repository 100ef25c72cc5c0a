package receiver

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// Orders is the reference's toy shop: each transfer pays an order, and
// the events move it along (orders), while account events keep the
// customer's account state (customer_accounts). Every applied event adds
// one to its row's events count, and a completed refund adds its amount
// to the order's refunded total: effects that are wrong if applied twice,
// so that a duplicate let through shows.
type Orders struct{}

// orderStatus is the order's status after a transfer event ("": the event
// does not change it).
var orderStatus = map[ledger.EventType]string{
	ledger.TransferCreated:   "awaiting_payment",
	ledger.TransferHeld:      "authorized",
	ledger.TransferCaptured:  "captured",
	ledger.TransferCompleted: "paid",
	ledger.TransferRejected:  "failed",
	ledger.TransferVoided:    "cancelled",
	ledger.TransferExpired:   "cancelled",
	ledger.TransferRefunded:  "returned",
}

// Apply applies one event in tx.
func (Orders) Apply(ctx context.Context, tx pgx.Tx, e Event) error {
	t := ledger.EventType(e.Type)
	if t.IsEndpoint() {
		return nil // the shop's own endpoint: news for its operators, not an order's
	}
	if t.IsAccount() {
		_, err := tx.Exec(ctx, `
			INSERT INTO customer_accounts AS c (account, status, events) VALUES ($1, $2, 1)
			ON CONFLICT (account) DO UPDATE SET status = excluded.status, events = c.events + 1, updated_at = now()`,
			e.Account, accountStatus(e))
		if err != nil {
			return fmt.Errorf("customer account %s: %w", e.Account, err)
		}
		return nil
	}
	tr := e.Data.Transfer
	order, status, refunded := tr.ID, orderStatus[t], int64(0)
	if tr.RefundOf != "" {
		// A refund's events concern the order it refunds.
		order, status = tr.RefundOf, ""
		if t == ledger.RefundCompleted {
			refunded, status = tr.Amount, "refunded"
		}
	}
	var amount *int64
	if tr.RefundOf == "" {
		amount = &tr.Amount
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO orders AS o (transfer_id, account, amount, currency, status, refunded, events)
		VALUES ($1, $2, $3, $4, coalesce(nullif($5, ''), 'unknown'), $6, 1)
		ON CONFLICT (transfer_id) DO UPDATE SET
		    account = coalesce(o.account, excluded.account), amount = coalesce(o.amount, excluded.amount),
		    status = coalesce(nullif($5, ''), o.status), refunded = o.refunded + $6, events = o.events + 1,
		    updated_at = now()`, order, accountOf(tr.RefundOf == "", e), amount, tr.Currency, status, refunded)
	if err != nil {
		return fmt.Errorf("order %s: %w", order, err)
	}
	return nil
}

func accountStatus(e Event) string {
	switch a := e.Data.Account; {
	case a.Closed:
		return ledger.AccountIsClosed
	case a.Frozen:
		return ledger.AccountIsFrozen
	}
	return ledger.AccountOpen
}

// accountOf is the paying account of an order's own transfer (nil for a
// refund's event, which names the payee).
func accountOf(own bool, e Event) *string {
	if !own {
		return nil
	}
	return &e.Data.Transfer.From
}
