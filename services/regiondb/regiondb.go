// Package regiondb owns a region database's schema. The ledger, the API
// and the dead-letter operations share one database per region, each with
// migration sets of its own; this package says which sets make up the
// schema and in which order they are applied, for `paymesh migrate`, which
// applies all of them, and for the services, which apply at start the
// parts they write (see Schema).
package regiondb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// Schema names the parts of a region's schema that one process migrates.
// Migrate applies them in one order whatever the process: the ledger's,
// the API's, the dead-letter audit's.
//
// What each process names (equal to what it migrated before this package
// gathered it):
//   - `paymesh migrate`: every part;
//   - the ledger: its own part, and the API's when it writes the API's
//     answers in its transaction (ledgerd.Config.AnswersSchema), so that
//     it commits whether or not the API has started;
//   - the API: its own part, and the dead-letter audit's when it serves
//     the operator endpoints. The ledger's tables the API's own
//     transactions write are the ledger's to migrate.
//
// The node leases (platform/nodelease) are not part of it: every process
// that leases a node migrates their table when it leases one.
type Schema struct {
	// Ledger, if set, is a ledger store over the database: its sets (the
	// consume-log's and the ledger's, postgres.Migrations) are applied and
	// its consume-log creates its day partitions (postgres.Store.Migrate).
	Ledger *postgres.Store
	// API, if set, is the API's migration set (apidb.Migrations). It is
	// handed in, not named here, because the ledger applies it too and
	// must not link the API (services/ledger/imports_test.go).
	API *pgdb.Migration
	// DeadLetters applies the dead-letter audit's set (dlq.Migrations).
	DeadLetters bool
	// Webhooks applies the webhooks' set (webhookdb.Migrations), which
	// reads the ledger's events: the API migrates it.
	Webhooks bool
}

// Migrate applies the parts of s to the database of pool (the database
// s.Ledger is over), in Schema's order. Concurrent migrations of one
// database take turns (pgdb.Migrate). It returns the first error, naming
// the part.
func Migrate(ctx context.Context, pool *pgxpool.Pool, s Schema) error {
	if s.Ledger != nil {
		if err := s.Ledger.Migrate(ctx); err != nil {
			return fmt.Errorf("region schema: ledger: %w", err)
		}
	}
	if s.API != nil {
		if err := pgdb.Migrate(ctx, pool, *s.API); err != nil {
			return fmt.Errorf("region schema: api: %w", err)
		}
	}
	if s.DeadLetters {
		if err := pgdb.Migrate(ctx, pool, dlq.Migrations()); err != nil {
			return fmt.Errorf("region schema: dead letters: %w", err)
		}
	}
	if s.Webhooks {
		if err := pgdb.Migrate(ctx, pool, webhookdb.Migrations()); err != nil {
			return fmt.Errorf("region schema: webhooks: %w", err)
		}
	}
	return nil
}
