package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
)

// ConsumeLog is the consume-log as the store uses it: how it names a
// request, layers 3 and 4 of the apply (see apply.go), the read-back of a
// COMMIT that got no answer, and the retention the store runs at
// migration. NewConsumeLog makes one of a *dedup.Log. It is an interface,
// owned here, so that a decorator can wrap it (traces or metrics of the
// claims, a fault suite's faults) without the store knowing.
type ConsumeLog interface {
	// RequestKey names a command to the consume-log: the key it is claimed
	// by, and so the key its earlier transfer is matched by in the
	// business-key layer too. Both layers ask this one method so that they
	// cannot disagree on what "the same request" is.
	RequestKey(c ledger.Command) string
	// SettledWithoutTable answers a batch the recent cache settles on its
	// own (see dedup.Log.SettledWithoutTable).
	SettledWithoutTable(consumer string, keys []dedup.Key) ([]dedup.Claim, bool)
	// QueueClaimForTx queues the claims on the caller's batch (see
	// dedup.Log.QueueClaimForTx).
	QueueClaimForTx(b *pgx.Batch, consumer string, keys []dedup.Key) (*dedup.PendingClaim, error)
	// Release gives back first claims of commands that did not apply.
	Release(ctx context.Context, tx dedup.Querier, consumer string, claims []dedup.Claim) error
	// Committed records a committed transaction's first claims in the
	// recent cache.
	Committed(consumer string, claims []dedup.Claim)
	// IsMine reads back whether a claim committed (see dedup.Log.IsMine).
	IsMine(ctx context.Context, q dedup.Querier, consumer string, c dedup.Claim) (bool, error)
	// Maintain creates and drops the day partitions.
	Maintain(ctx context.Context, pool *pgxpool.Pool) (dedup.Maintenance, error)
	// Horizon is the oldest day the consume-log keeps.
	Horizon() time.Time
}

// NewConsumeLog returns l as the ledger's consume-log: a command is named
// by ledger.Command.MsgKey, a client and its Idempotency-Key (a saga step:
// its transfer and step).
func NewConsumeLog(l *dedup.Log) ConsumeLog { return requestLog{l} }

// requestLog is a *dedup.Log that names commands by their MsgKey.
type requestLog struct{ *dedup.Log }

func (requestLog) RequestKey(c ledger.Command) string { return c.MsgKey() }
