package chaos

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// The faults of the ledger's apply (scenarios 3, 4 and 5): decorators of
// the store's consume-log (postgres.ConsumeLog) and a request key, which
// install puts into every region's ledger through cluster.Config.Ledger.

// seenBeforeCommit is scenario 3's fault, the "SETNX before processing"
// mistake: it records a batch's keys in the recent-commit cache as soon as
// they are claimed, before the transaction commits. A redelivery, or the
// next attempt, of a batch whose transaction then fails is taken for a
// duplicate and acked: the transfer is lost. (It records every key of the
// claim, where the correct log records its first claims after COMMIT.)
type seenBeforeCommit struct{ postgres.ConsumeLog }

// QueueClaimForTx queues the claim, then marks its keys done in the cache
// (after the claim has asked the cache, or every key would be a duplicate).
func (l seenBeforeCommit) QueueClaimForTx(b *pgx.Batch, consumer string, keys []dedup.Key) (*dedup.PendingClaim, error) {
	p, err := l.ConsumeLog.QueueClaimForTx(b, consumer, keys)
	if err != nil {
		return nil, err
	}
	done := make([]dedup.Claim, len(keys))
	for i, k := range keys {
		done[i] = dedup.Claim{Key: k, Outcome: dedup.First}
	}
	l.ConsumeLog.Committed(consumer, done)
	return p, nil
}

// assumeCommitted is scenario 5's fault: a COMMIT the server never
// answered is taken for a success without reading the consume-log back, so
// a batch cut off before its COMMIT reached the server is acked, and lost.
type assumeCommitted struct{ postgres.ConsumeLog }

// IsMine answers "committed" without asking.
func (assumeCommitted) IsMine(context.Context, dedup.Querier, string, dedup.Claim) (bool, error) {
	return true, nil
}

// keyByTransferID is half of scenario 4's fault: a consume-log that names a
// client request by its transfer ID as well as its idempotency key, so it
// claims a request sent again under a new transfer ID as new, and the
// business-key match (which asks the consume-log for the same name) finds
// no earlier transfer. With the schema's unique (client, key) constraint
// dropped too (the other half, dropBusinessKey), the request applies again.
type keyByTransferID struct{ postgres.ConsumeLog }

func (l keyByTransferID) RequestKey(c ledger.Command) string {
	if c.IsStep() {
		return l.ConsumeLog.RequestKey(c)
	}
	return l.ConsumeLog.RequestKey(c) + "#" + c.TransferID
}

// onLedger makes every region's ledger configuration go through change,
// after the changes installed before it.
func onLedger(c *cluster.Config, change func(*ledgerd.Config)) {
	prev := c.Ledger
	c.Ledger = func(region string, lc *ledgerd.Config) {
		if prev != nil {
			prev(region, lc)
		}
		change(lc)
	}
}

// wrapConsumeLog makes every region's store decorate its consume-log with
// wrap, around the decorators installed before it.
func wrapConsumeLog(c *cluster.Config, wrap func(postgres.ConsumeLog) postgres.ConsumeLog) {
	onLedger(c, func(lc *ledgerd.Config) {
		inner := lc.WrapConsumeLog
		lc.WrapConsumeLog = func(l postgres.ConsumeLog) postgres.ConsumeLog {
			if inner != nil {
				l = inner(l)
			}
			return wrap(l)
		}
	})
}

// refundByParent is the refunds' key fault: a consume-log that names a
// refund by the transfer it refunds instead of by its own idempotency key,
// so it takes a second refund of one transfer for a repeat of the first
// (or a conflict with it) and never applies it, though its router
// acknowledged it.
type refundByParent struct{ postgres.ConsumeLog }

func (l refundByParent) RequestKey(c ledger.Command) string {
	if c.Type == ledger.TypeRefund {
		return "refund/" + c.RefundOf
	}
	return l.ConsumeLog.RequestKey(c)
}
