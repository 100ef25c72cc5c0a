package regiondb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/regiondb"
)

// TestMigrate: each schema a process names migrates its parts and no
// other, the ledger's with the consume-log's day partitions, and running
// it again changes nothing.
func TestMigrate(t *testing.T) {
	api := apidb.Migrations()
	versionTables := []string{dedup.MigrationTable, "ledger_schema_version", apidb.MigrationTable, "dlq_audit_schema_version"}
	for _, tc := range []struct {
		name       string
		ledger     bool
		schema     regiondb.Schema
		want       map[string]bool // version tables that exist afterwards
		partitions bool
	}{
		{"Migrate", true, regiondb.Schema{API: &api, DeadLetters: true},
			map[string]bool{dedup.MigrationTable: true, "ledger_schema_version": true, apidb.MigrationTable: true, "dlq_audit_schema_version": true}, true},
		{"Ledger", true, regiondb.Schema{API: &api},
			map[string]bool{dedup.MigrationTable: true, "ledger_schema_version": true, apidb.MigrationTable: true}, true},
		{"API", false, regiondb.Schema{API: &api},
			map[string]bool{apidb.MigrationTable: true}, false},
		{"APIWithOperators", false, regiondb.Schema{API: &api, DeadLetters: true},
			map[string]bool{apidb.MigrationTable: true, "dlq_audit_schema_version": true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool, _ := pgtest.MustDatabase(t)
			if tc.ledger {
				tc.schema.Ledger = postgres.New(pool, postgres.Config{Region: "eu", Dedup: postgres.NewConsumeLog(dedup.New(dedup.Config{WindowDays: 2}))})
			}
			for range 2 {
				if err := regiondb.Migrate(ctx, pool, tc.schema); err != nil {
					t.Fatal(err)
				}
			}
			for _, table := range versionTables {
				var exists bool
				if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
					t.Fatal(err)
				}
				if exists != tc.want[table] {
					t.Errorf("version table %s: exists %v, want %v", table, exists, tc.want[table])
				}
			}
			var partitions int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('dedup_log')`).Scan(&partitions); err != nil {
				t.Fatal(err)
			}
			if (partitions > 0) != tc.partitions {
				t.Errorf("consume-log partitions: %d, want some: %v", partitions, tc.partitions)
			}
		})
	}
}

// TestMigrateNamesThePart: a failing part is named in the error.
func TestMigrateNamesThePart(t *testing.T) {
	pool, _ := pgtest.MustDatabase(t)
	bad := pgdb.Migration{FS: apidb.Migrations().FS, Table: "not a table name"}
	err := regiondb.Migrate(context.Background(), pool, regiondb.Schema{API: &bad})
	if err == nil || !strings.Contains(err.Error(), "region schema: api") {
		t.Fatalf("got %v, want an error naming the API's part", err)
	}
}
