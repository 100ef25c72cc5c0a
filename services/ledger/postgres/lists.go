package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// listQuery is a list's WHERE clause made of the filters a request sets
// and nothing else. Each combination of filters is then a statement of its
// own, whose cached plan uses the index that combination needs: one
// statement with every filter optional ("$n = ” OR …") gets one generic
// plan for all of them, and that plan walks the client's whole index for a
// reference or an account.
type listQuery struct {
	where []string
	args  pgx.NamedArgs
}

func newListQuery(cond string, args pgx.NamedArgs) *listQuery {
	return &listQuery{where: []string{cond}, args: args}
}

// and adds cond when set, with its named arguments.
func (q *listQuery) and(set bool, cond string, args pgx.NamedArgs) {
	if !set {
		return
	}
	q.where = append(q.where, cond)
	for k, v := range args {
		q.args[k] = v
	}
}

func (q *listQuery) sql() string { return strings.Join(q.where, " AND ") }

// newestFirst orders a list page: created_at, then ID, descending.
const newestFirst = ` ORDER BY created_at DESC, id DESC LIMIT @limit`

// after is the condition of a page under a cursor.
const after = `(created_at, id) < (@after_at, @after_id::text COLLATE "C")`

// TransfersPage returns up to limit of a client's transfers that f
// selects, newest first (created_at, then id, descending). Each filter is
// served by an index: the client's (transfers_client_created), an
// account's as payer and as payee (transfers_from_created and
// transfers_to_created, merged), a reference's (transfers_client_reference)
// and the metadata's (transfers_metadata).
func (s *Store) TransfersPage(ctx context.Context, f ledger.TransferFilter, limit int) ([]ledger.Transfer, error) {
	q := newListQuery(`client_id = @client`, pgx.NamedArgs{"client": f.ClientID, "limit": limit})
	q.and(f.Status != "", `status = @status`, pgx.NamedArgs{"status": string(f.Status)})
	q.and(f.CreatedFrom != nil, `created_at >= @from`, pgx.NamedArgs{"from": f.CreatedFrom})
	q.and(f.CreatedTo != nil, `created_at < @to`, pgx.NamedArgs{"to": f.CreatedTo})
	if f.After != nil {
		q.and(true, after, pgx.NamedArgs{"after_at": f.After.CreatedAt, "after_id": f.After.ID})
	}
	q.and(f.Reference != "", `reference = @reference`, pgx.NamedArgs{"reference": f.Reference})
	q.and(f.Metadata != nil, `metadata @> @metadata::jsonb`, pgx.NamedArgs{"metadata": metadataJSON(f.Metadata)})
	sql := `SELECT ` + transferColumns + ` FROM transfers WHERE ` + q.sql() + newestFirst
	if f.Account != "" {
		// Paid by the account, then paid to it (and not by it), each the
		// first page of its own index, merged.
		q.args["account"] = f.Account
		sql = `SELECT ` + transferColumns + ` FROM (
			(SELECT * FROM transfers WHERE from_account = @account AND ` + q.sql() + newestFirst + `)
			UNION ALL
			(SELECT * FROM transfers WHERE to_account = @account AND from_account <> @account AND ` + q.sql() + newestFirst + `)
		) t` + newestFirst
	}
	rows, err := s.pool.Query(ctx, sql, q.args)
	if err != nil {
		return nil, fmt.Errorf("list transfers: %w", err)
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil {
		return nil, fmt.Errorf("list transfers: %w", err)
	}
	return ts, nil
}

// AccountsPage returns up to limit of a client's customer accounts that f
// selects, newest first (created_at, then id, descending).
func (s *Store) AccountsPage(ctx context.Context, f ledger.AccountFilter, limit int) ([]ledger.Account, error) {
	q := newListQuery(`client_id = @client AND kind = 'customer'`, pgx.NamedArgs{"client": f.ClientID, "limit": limit})
	q.and(f.Currency != "", `currency = @currency`, pgx.NamedArgs{"currency": f.Currency})
	if f.After != nil {
		q.and(true, after, pgx.NamedArgs{"after_at": f.After.CreatedAt, "after_id": f.After.ID})
	}
	q.and(f.Reference != "", `reference = @reference`, pgx.NamedArgs{"reference": f.Reference})
	q.and(f.Metadata != nil, `metadata @> @metadata::jsonb`, pgx.NamedArgs{"metadata": metadataJSON(f.Metadata)})
	rows, err := s.pool.Query(ctx, `SELECT `+labeledColumns+` FROM accounts WHERE `+q.sql()+newestFirst, q.args)
	if err != nil {
		return nil, fmt.Errorf("list accounts: %w", err)
	}
	as, err := pgx.CollectRows(rows, scanLabeled)
	if err != nil {
		return nil, fmt.Errorf("list accounts: %w", err)
	}
	return as, nil
}
