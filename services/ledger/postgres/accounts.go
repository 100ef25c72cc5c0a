package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

const accountColumns = `id, client_id, kind, currency, balance, floor, closed, version, created_at, held, frozen`

func scanAccount(row pgx.CollectableRow) (ledger.Account, error) {
	var a ledger.Account
	err := row.Scan(accountFields(&a)...)
	return a, err
}

// accountFields are the destinations of accountColumns in a.
func accountFields(a *ledger.Account) []any {
	return []any{&a.ID, &a.ClientID, &a.Kind, &a.Currency, &a.Balance, &a.Floor, &a.Closed, &a.Version, &a.CreatedAt, &a.Held, &a.Frozen}
}

// labeledColumns are accountColumns with the client's reference and
// metadata, for the reads of an account (scanLabeled); the apply reads
// accountColumns only.
const labeledColumns = accountColumns + `, coalesce(reference, ''), metadata`

func scanLabeled(row pgx.CollectableRow) (ledger.Account, error) {
	var a ledger.Account
	err := row.Scan(append(accountFields(&a), &a.Reference, &a.Metadata)...)
	return a, err
}

// QueueAccounts queues in b the read of the accounts ids into out, by ID
// (a missing one is absent), in one statement: a caller composes it with its own statements in one round trip. The
// batch's Close returns the read's error.
func QueueAccounts(b *pgx.Batch, ids []string, out map[string]ledger.Account) {
	b.Queue(`SELECT `+accountColumns+` FROM accounts WHERE id = ANY($1::text[])`, ids).Query(func(rows pgx.Rows) error {
		var a ledger.Account
		_, err := pgx.ForEachRow(rows, accountFields(&a), func() error {
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

// maxIDTries bounds the IDs CreateAccount mints for one account when the
// ones before were taken.
const maxIDTries = 4

// errIDTaken reports that the ID minted for a new account is another
// account's.
var errIDTaken = errors.New("account id taken")

// CreateAccount opens an account in this region, and the region's issuance
// and transit accounts for its currency if there are none yet, and says
// whether it opened it. Under an idempotency key (n.IdempotencyKey) a
// client's key opens one account: when the key opened one before for the
// same request (n.RequestHash), it returns that account and created
// false; for another request, an *ledger.Error with
// CodeIdempotencyKeyReused. It returns an *ledger.Error for an invalid
// request. An ID minted for it that another account has (a node's IDs
// repeat after its clock was stepped) is counted
// (ledger.Stats.AccountIDCollisions) and replaced by a new one, up to
// maxIDTries; past that it returns an error.
func (s *Store) CreateAccount(ctx context.Context, n ledger.NewAccount) (a ledger.Account, created bool, err error) {
	if err := n.Validate(); err != nil {
		return ledger.Account{}, false, err
	}
	var ids [3]string // the account, and the issuance and transit accounts if missing
	for i := range ids {
		if ids[i], err = s.cfg.IDs.NextString(); err != nil {
			return ledger.Account{}, false, fmt.Errorf("create account: %w", err)
		}
	}
	for try := 1; ; try++ {
		a, created, err = s.createAccount(ctx, n, ids)
		if !errors.Is(err, errIDTaken) {
			return a, created, err
		}
		s.stats().AccountIDCollisions.Add(1)
		if try == maxIDTries {
			return ledger.Account{}, false, fmt.Errorf("%w (the %d IDs minted in a row were all other accounts': a node's clock stepped back?)", err, try)
		}
		if ids[0], err = s.cfg.IDs.NextString(); err != nil {
			return ledger.Account{}, false, fmt.Errorf("create account: %w", err)
		}
	}
}

// createAccount opens the account n as ids[0], in one transaction with
// the currency's issuance and transit accounts (ids[1], ids[2]) if they
// are missing, or finds the account n's key opened (created false). It
// returns errIDTaken when ids[0] is another account's.
func (s *Store) createAccount(ctx context.Context, n ledger.NewAccount, ids [3]string) (ledger.Account, bool, error) {
	id := ids[0]
	var a ledger.Account
	created := false
	err := s.transact(ctx, "create account", func(tx pgx.Tx) error {
		for i, kind := range []ledger.Kind{ledger.KindIssuance, ledger.KindTransit} {
			if _, err := tx.Exec(ctx, `
				INSERT INTO accounts (id, client_id, kind, currency, floor) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (currency) WHERE kind = '`+string(kind)+`' DO NOTHING`,
				ids[i+1], SystemClient, kind, n.Currency, int64(ledger.NoFloor)); err != nil {
				return err
			}
		}
		// ON CONFLICT on any unique index: the ID (a rerun finds the
		// account it created if an attempt before committed after all;
		// any other account under the ID is not this one: ours) and,
		// under a key, the client's key (the account the key opened
		// before, or that a request in flight with it just opened: the
		// insert waits for that one's transaction).
		// A reference another account holds is refused, naming it.
		tag, err := tx.Exec(ctx, `
			INSERT INTO accounts (id, client_id, kind, currency, floor, idempotency_key, request_hash, reference, metadata)
			VALUES ($1, $2, 'customer', $3, $4, NULLIF($5, ''), $6, NULLIF($7, ''), $8::jsonb)
			ON CONFLICT DO NOTHING`, id, n.ClientID, n.Currency, n.Floor, n.IdempotencyKey, n.RequestHash, n.Reference, metadataJSON(n.Metadata))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			if err := s.recordOpened(ctx, tx, ledger.Account{ID: id, ClientID: n.ClientID}); err != nil {
				return err
			}
		}
		if tag.RowsAffected() == 0 && n.Reference != "" {
			if err := referenceFree(ctx, tx, n, id); err != nil {
				return err
			}
		}
		if n.IdempotencyKey != "" {
			a, created, err = byKey(ctx, tx, n, id)
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+labeledColumns+` FROM accounts WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if a, err = pgx.CollectExactlyOneRow(rows, scanLabeled); err == nil && !ours(a, n) {
			err = fmt.Errorf("%w: %s is a %s account of client %q", errIDTaken, id, a.Kind, a.ClientID)
		}
		created = err == nil
		return err
	}, func(ctx context.Context) (bool, error) {
		// A COMMIT whose answer was lost: the account is there if it
		// committed (else the rerun creates it, or finds the one its key
		// opened).
		got, err := s.Account(ctx, id)
		if ledger.ErrorCode(err) == ledger.CodeAccountNotFound {
			return false, nil
		}
		return err == nil && ours(got, n), err
	})
	return a, created, err
}

// referenceFree returns an *ledger.Error with CodeReferenceInUse, naming
// the account, when n's reference is held by an account of the client
// other than the one n's key opened or the one minted for n as id.
func referenceFree(ctx context.Context, tx pgx.Tx, n ledger.NewAccount, id string) error {
	var holder, key string
	err := tx.QueryRow(ctx, `SELECT id, coalesce(idempotency_key, '') FROM accounts WHERE client_id = $1 AND reference = $2`,
		n.ClientID, n.Reference).Scan(&holder, &key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	case holder == id || n.IdempotencyKey != "" && key == n.IdempotencyKey:
		return nil
	}
	e := ledger.Errorf(ledger.CodeReferenceInUse, "reference %q is account %s's", n.Reference, holder)
	e.Existing = holder
	return e
}

// byKey reads, in tx, the account a client's idempotency key opened: the
// one minted as id (created), or one an earlier request opened. It
// returns an *ledger.Error with CodeIdempotencyKeyReused when that
// request was another one, and errIDTaken when the key opened none (id was
// another account's, so the insert did nothing).
func byKey(ctx context.Context, tx pgx.Tx, n ledger.NewAccount, id string) (ledger.Account, bool, error) {
	var a ledger.Account
	var hash []byte
	err := tx.QueryRow(ctx, `SELECT `+labeledColumns+`, request_hash FROM accounts WHERE client_id = $1 AND idempotency_key = $2`,
		n.ClientID, n.IdempotencyKey).Scan(append(accountFields(&a), &a.Reference, &a.Metadata, &hash)...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ledger.Account{}, false, fmt.Errorf("%w: %s is another account", errIDTaken, id)
	case err != nil:
		return ledger.Account{}, false, err
	case !bytes.Equal(hash, n.RequestHash):
		return ledger.Account{}, false, ledger.Errorf(ledger.CodeIdempotencyKeyReused,
			"idempotency key %q of client %q opened account %s for a different request", n.IdempotencyKey, n.ClientID, a.ID)
	}
	return a, a.ID == id, nil
}

// ours reports whether a, found under the ID minted for n, is the account
// n's creation made: of its client, kind, currency and floor, and
// untouched, as the row a rerun after a lost COMMIT finds (its ID is known
// to no one else yet).
func ours(a ledger.Account, n ledger.NewAccount) bool {
	return a.ClientID == n.ClientID && a.Kind == ledger.KindCustomer && a.Currency == n.Currency && a.Floor == n.Floor &&
		a.Version == 0 && !a.Closed
}

// Account returns an account, or an *ledger.Error with CodeAccountNotFound.
func (s *Store) Account(ctx context.Context, id string) (ledger.Account, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+labeledColumns+` FROM accounts WHERE id = $1`, id)
	if err != nil {
		return ledger.Account{}, fmt.Errorf("read account: %w", err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, scanLabeled)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Account{}, ledger.Errorf(ledger.CodeAccountNotFound, "account %s does not exist", id)
	}
	if err != nil {
		return ledger.Account{}, fmt.Errorf("read account: %w", err)
	}
	return a, nil
}

// Postings returns an account's change-log in version order.
func (s *Store) Postings(ctx context.Context, accountID string) ([]ledger.Posting, error) {
	return s.PostingsPage(ctx, accountID, 0, 1<<31-1)
}
