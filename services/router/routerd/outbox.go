package routerd

import (
	"context"

	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/router"
)

// outbox is the ledger store's outbox as the relay asks for it
// (router.Outbox). The router and the ledger's Postgres adapter do not know
// each other: the router declares what it needs, and this wiring, which
// links both, translates the ledger's rows into the router's steps.
type outbox struct {
	store   *postgres.Store
	written <-chan struct{} // the store's WatchOutbox
}

var _ router.Outbox = outbox{}

// Written signals the commits that wrote steps due now (see
// postgres.Store.WatchOutbox).
func (o outbox) Written() <-chan struct{} { return o.written }

// PendingSteps returns the store's pending outbox rows as steps (see
// postgres.Store.PendingOutbox).
func (o outbox) PendingSteps(ctx context.Context, limit int, skip ...string) ([]router.Step, error) {
	rows, err := o.store.PendingOutbox(ctx, limit, skip...)
	if err != nil {
		return nil, err
	}
	steps := make([]router.Step, len(rows))
	for i, row := range rows {
		steps[i] = router.Step{ID: row.ID, MsgID: row.MsgID, Region: row.Region, Account: row.Account, Payload: row.Payload,
			Attempts: row.Attempts, TraceParent: row.TraceParent}
	}
	return steps, nil
}

// MarkSent marks the rows sent (see postgres.Store.MarkSent).
func (o outbox) MarkSent(ctx context.Context, ids []int64) error { return o.store.MarkSent(ctx, ids) }

// MarkFailed counts a failed attempt of the rows (see
// postgres.Store.MarkFailed).
func (o outbox) MarkFailed(ctx context.Context, ids []int64) error {
	return o.store.MarkFailed(ctx, ids)
}
