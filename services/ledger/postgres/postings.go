package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// PostingsPage returns up to limit change-log rows of an account with a
// version above after, in version order.
func (s *Store) PostingsPage(ctx context.Context, accountID string, after int64, limit int) ([]ledger.Posting, error) {
	return s.postings(ctx, `account_id = $1 AND account_version > $2 ORDER BY account_version LIMIT $3`, accountID, after, limit)
}

// TransferPostings returns a transfer's change-log rows in this region.
func (s *Store) TransferPostings(ctx context.Context, transferID string) ([]ledger.Posting, error) {
	return s.postings(ctx, `transfer_id = $1 ORDER BY created_at, leg`, transferID)
}

func (s *Store) postings(ctx context.Context, where string, args ...any) ([]ledger.Posting, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT transfer_id, leg, account_id, amount, balance_after, account_version
		FROM postings WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("read postings: %w", err)
	}
	ps, err := pgx.CollectRows(rows, scanPosting)
	if err != nil {
		return nil, fmt.Errorf("read postings: %w", err)
	}
	return ps, nil
}

func scanPosting(r pgx.CollectableRow) (ledger.Posting, error) {
	var p ledger.Posting
	err := r.Scan(&p.TransferID, &p.Leg, &p.AccountID, &p.Amount, &p.BalanceAfter, &p.AccountVersion)
	return p, err
}
