package postgres

import (
	"context"
	"fmt"
	"time"

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
		SELECT transfer_id, leg, account_id, amount, balance_after, account_version, created_at
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
	err := r.Scan(&p.TransferID, &p.Leg, &p.AccountID, &p.Amount, &p.BalanceAfter, &p.AccountVersion, &p.CreatedAt)
	return p, err
}

// BalanceAt returns an account's balance at an instant: the balance after
// its last change-log row written at or before at, and what its holds
// reserved then (each hold from its held_at, up to but not including its
// released_at), read in one snapshot.
func (s *Store) BalanceAt(ctx context.Context, accountID string, at time.Time) (ledger.Balance, error) {
	at = at.Truncate(time.Microsecond) // Postgres's precision: a row at T is at or before T.0000005
	var b ledger.Balance
	err := s.pool.QueryRow(ctx, `
		SELECT coalesce(p.balance_after, 0), coalesce(p.account_version, 0),
		       (SELECT coalesce(sum(amount), 0) FROM transfers
		        WHERE from_account = $1 AND held_at <= $2 AND (released_at IS NULL OR released_at > $2))
		FROM (VALUES (1)) one LEFT JOIN postings p ON p.account_id = $1 AND p.account_version = `+versionBefore("<= $2"),
		accountID, at).Scan(&b.Balance, &b.Version, &b.Held)
	if err != nil {
		return ledger.Balance{}, fmt.Errorf("balance at %s: %w", at.Format(time.RFC3339Nano), err)
	}
	return b, nil
}

// Statement returns an account's statement over [from, to): the balance
// before from (opening) and before to (closing), and up to limit of the
// change-log rows written in between with a version above after, in
// version order. Opening plus the amounts of all the rows in between is
// closing, and each row's balance_after is the running sum.
func (s *Store) Statement(ctx context.Context, accountID string, from, to time.Time, after int64, limit int) (ledger.Statement, error) {
	st := ledger.Statement{AccountID: accountID, From: from, To: to}
	// Postgres's precision is a microsecond: [T.0000005, …) starts after a
	// row at T, and [… , T.0000005) ends after it.
	from, to = ceilMicro(from), ceilMicro(to)
	// One snapshot for the three reads, so that they agree while rows
	// keep arriving after to.
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// The versions before from and before to bound the rows between:
		// an account's rows carry times in version order.
		var opening, closing *int64
		err := tx.QueryRow(ctx, `
			SELECT `+versionBefore("< $2")+`, `+versionBefore("< $3"), accountID, from, to).Scan(&opening, &closing)
		if err != nil || closing == nil {
			return err // nil: no row before to, an empty statement
		}
		err = tx.QueryRow(ctx, `
			SELECT coalesce((SELECT balance_after FROM postings WHERE account_id = $1 AND account_version = $2), 0),
			       (SELECT balance_after FROM postings WHERE account_id = $1 AND account_version = $3)`,
			accountID, opening, *closing).Scan(&st.Opening, &st.Closing)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			SELECT transfer_id, leg, account_id, amount, balance_after, account_version, created_at FROM postings
			WHERE account_id = $1 AND account_version > greatest($2::bigint, $3) AND account_version <= $4
			ORDER BY account_version LIMIT $5`, accountID, opening, after, *closing, limit)
		if err != nil {
			return err
		}
		st.Entries, err = pgx.CollectRows(rows, scanPosting)
		return err
	})
	if err != nil {
		return ledger.Statement{}, fmt.Errorf("statement of %s: %w", accountID, err)
	}
	return st, nil
}

// versionBefore is the subquery of an account's ($1) last version written
// at the times cond selects ("< $2"). It walks the account's versions back
// from the newest in postings_account_version, whose created_at answers
// cond from the index alone: no table row is read on the way.
func versionBefore(cond string) string {
	return `(SELECT account_version FROM postings WHERE account_id = $1 AND created_at ` + cond + ` ORDER BY account_version DESC LIMIT 1)`
}

// ceilMicro rounds t up to a whole microsecond.
func ceilMicro(t time.Time) time.Time {
	if d := t.Truncate(time.Microsecond); !d.Equal(t) {
		return d.Add(time.Microsecond)
	}
	return t
}
