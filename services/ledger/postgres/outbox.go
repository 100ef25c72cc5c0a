package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxRow is a saga step waiting to be relayed to the ledger of Region.
type OutboxRow struct {
	ID       int64
	MsgID    string // the step's Nats-Msg-Id
	Region   string // the region whose ledger applies it
	Account  string // the account whose shard carries it
	Payload  []byte // the encoded ledger.Command
	Attempts int
	Created  time.Time
	// TraceParent continues the transfer's trace when the step is relayed.
	TraceParent string
}

// PendingOutbox returns up to limit unsent rows, oldest first, skipping
// rows for the regions in skip (unreachable ones, so that they cannot hold
// up the others).
func (s *Store) PendingOutbox(ctx context.Context, limit int, skip ...string) ([]OutboxRow, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, msg_id, region, account, payload, attempts, created_at, trace_parent
		FROM outbox WHERE sent_at IS NULL AND NOT (region = ANY($2::text[])) ORDER BY id LIMIT $1`, limit, append([]string{}, skip...))
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		err := r.Scan(&o.ID, &o.MsgID, &o.Region, &o.Account, &o.Payload, &o.Attempts, &o.Created, &o.TraceParent)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	return out, nil
}

// MarkSent records that the rows' steps were acked by their destination
// streams. It must only be called after the PubAck: a row marked sent is
// never relayed again.
func (s *Store) MarkSent(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `UPDATE outbox SET sent_at = now(), attempts = attempts + 1 WHERE id = ANY($1::bigint[]) AND sent_at IS NULL`, ids); err != nil {
		return fmt.Errorf("mark outbox sent: %w", err)
	}
	return nil
}

// MarkFailed counts a failed relay attempt of the rows.
func (s *Store) MarkFailed(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `UPDATE outbox SET attempts = attempts + 1 WHERE id = ANY($1::bigint[]) AND sent_at IS NULL`, ids); err != nil {
		return fmt.Errorf("mark outbox attempt: %w", err)
	}
	return nil
}

// OutboxLag returns how many rows wait to be relayed and the age of the
// oldest.
func (s *Store) OutboxLag(ctx context.Context) (unsent int64, oldest time.Duration, err error) {
	var age *time.Duration
	err = s.pool.QueryRow(ctx, `SELECT count(*), max(now() - created_at) FROM outbox WHERE sent_at IS NULL`).Scan(&unsent, &age)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox lag: %w", err)
	}
	if age != nil {
		oldest = *age
	}
	return unsent, oldest, nil
}

// InTransit returns how many transfers sourced here are DEBITED (their
// money between regions) and their total amount.
func (s *Store) InTransit(ctx context.Context) (count, amount int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM transfers WHERE status = 'DEBITED'`).Scan(&count, &amount)
	if err != nil {
		return 0, 0, fmt.Errorf("in transit: %w", err)
	}
	return count, amount, nil
}

// InTransitOldest returns the age of the oldest transfer sourced here that
// is still DEBITED (since its creation), 0 when none is; it returns an
// error when the query fails.
func (s *Store) InTransitOldest(ctx context.Context) (time.Duration, error) {
	var age *time.Duration
	if err := s.pool.QueryRow(ctx, `SELECT max(now() - created_at) FROM transfers WHERE status = 'DEBITED'`).Scan(&age); err != nil {
		return 0, fmt.Errorf("in transit oldest: %w", err)
	}
	if age == nil || *age < 0 {
		return 0, nil
	}
	return *age, nil
}
