package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

const accountColumns = `id, client_id, kind, currency, balance, floor, closed, version, created_at, held`

func scanAccount(row pgx.CollectableRow) (ledger.Account, error) {
	var a ledger.Account
	err := row.Scan(&a.ID, &a.ClientID, &a.Kind, &a.Currency, &a.Balance, &a.Floor, &a.Closed, &a.Version, &a.CreatedAt, &a.Held)
	return a, err
}

// QueueAccounts queues in b the read of the accounts ids into out, by ID
// (a missing one is absent), in one statement: a caller composes it with its own statements in one round trip. The
// batch's Close returns the read's error.
func QueueAccounts(b *pgx.Batch, ids []string, out map[string]ledger.Account) {
	b.Queue(`SELECT `+accountColumns+` FROM accounts WHERE id = ANY($1::text[])`, ids).Query(func(rows pgx.Rows) error {
		var a ledger.Account
		_, err := pgx.ForEachRow(rows, []any{&a.ID, &a.ClientID, &a.Kind, &a.Currency, &a.Balance, &a.Floor, &a.Closed, &a.Version, &a.CreatedAt, &a.Held}, func() error {
			out[a.ID] = a
			return nil
		})
		return err
	})
}

// CustomerOfSQL returns an SQL condition, for a statement of the caller's
// on this database, that the account whose ID is the parameter account (for
// example "$9") is a customer account of the client that is the parameter
// client: the ownership rule of a client's requests, spelled once.
func CustomerOfSQL(account, client string) string {
	return `EXISTS (SELECT 1 FROM accounts WHERE id = ` + account + ` AND client_id = ` + client + ` AND kind = 'customer')`
}

// SystemClient owns the issuance and transit accounts.
const SystemClient = "paymesh"

// CreateAccount opens an account in this region, and the region's issuance
// and transit accounts for its currency if there are none yet. It returns an *ledger.Error
// for an invalid request.
func (s *Store) CreateAccount(ctx context.Context, n ledger.NewAccount) (ledger.Account, error) {
	if err := n.Validate(); err != nil {
		return ledger.Account{}, err
	}
	var ids [3]string // the account, and the issuance and transit accounts if missing
	for i := range ids {
		var err error
		if ids[i], err = s.cfg.IDs.NextString(); err != nil {
			return ledger.Account{}, fmt.Errorf("create account: %w", err)
		}
	}
	id := ids[0]
	var a ledger.Account
	err := s.transact(ctx, "create account", func(tx pgx.Tx) error {
		for i, kind := range []ledger.Kind{ledger.KindIssuance, ledger.KindTransit} {
			if _, err := tx.Exec(ctx, `
				INSERT INTO accounts (id, client_id, kind, currency, floor) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (currency) WHERE kind = '`+string(kind)+`' DO NOTHING`,
				ids[i+1], SystemClient, kind, n.Currency, int64(ledger.NoFloor)); err != nil {
				return err
			}
		}
		// ON CONFLICT: a rerun after a COMMIT whose answer was lost finds
		// the account it created.
		if _, err := tx.Exec(ctx, `
			INSERT INTO accounts (id, client_id, kind, currency, floor) VALUES ($1, $2, 'customer', $3, $4)
			ON CONFLICT (id) DO NOTHING`, id, n.ClientID, n.Currency, n.Floor); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+accountColumns+` FROM accounts WHERE id = $1`, id)
		if err != nil {
			return err
		}
		a, err = pgx.CollectExactlyOneRow(rows, scanAccount)
		return err
	}, nil)
	return a, err
}

// Account returns an account, or an *ledger.Error with CodeAccountNotFound.
func (s *Store) Account(ctx context.Context, id string) (ledger.Account, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+accountColumns+` FROM accounts WHERE id = $1`, id)
	if err != nil {
		return ledger.Account{}, fmt.Errorf("read account: %w", err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, scanAccount)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Account{}, ledger.Errorf(ledger.CodeAccountNotFound, "account %s does not exist", id)
	}
	if err != nil {
		return ledger.Account{}, fmt.Errorf("read account: %w", err)
	}
	return a, nil
}

// CloseAccount marks an account closed; later transfers touching it are
// rejected. It returns CodeAccountNotFound for an unknown account.
func (s *Store) CloseAccount(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE accounts SET closed = true WHERE id = $1 AND kind = 'customer'`, id)
	if err != nil {
		return fmt.Errorf("close account: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ledger.Errorf(ledger.CodeAccountNotFound, "account %s does not exist", id)
	}
	return nil
}

// Postings returns an account's change-log in version order.
func (s *Store) Postings(ctx context.Context, accountID string) ([]ledger.Posting, error) {
	return s.PostingsPage(ctx, accountID, 0, 1<<31-1)
}
