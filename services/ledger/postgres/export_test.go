package postgres

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/paymesh/paymesh/services/ledger"
)

// UpdateBalancesSQL exposes the balance compare-and-set to tests.
const UpdateBalancesSQL = updateBalancesSQL

// AdvanceTransfersSQL exposes the transfer compare-and-set to tests.
const AdvanceTransfersSQL = advanceTransfersSQL

// MaxIDTries exposes the bound on the IDs minted for one account.
const MaxIDTries = maxIDTries

// StatementSQL exposes the statements check's query, for a schema older
// than the whole of verify's.
const StatementSQL = statementSQL

// CloseAccount marks an account closed behind the ledger's back, whatever
// it holds (a close through the pipeline needs it empty): for the tests of
// what a closed account refuses.
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

// MigrationFiles exposes the embedded migrations, for tests that migrate
// down.
func MigrationFiles() fs.FS { return migrationFiles }
