package pgdb_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/platform/pgdb"
)

// TestMigrateConcurrently: processes that migrate one database at the same
// time (a region's ledger and API at start) take turns, and every one of
// them succeeds.
func TestMigrateConcurrently(t *testing.T) {
	pool, _ := pgtest.MustDatabase(t)
	set := pgdb.Migration{Table: "probe_schema_version", FS: fstest.MapFS{
		"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE probe_a (id int);\nSELECT pg_sleep(0.2);\n-- +goose Down\nDROP TABLE probe_a;\n")},
		"00002_b.sql": {Data: []byte("-- +goose Up\nCREATE TABLE probe_b (id int);\n-- +goose Down\nDROP TABLE probe_b;\n")},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const procs = 4
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() { errs[i] = pgdb.Migrate(ctx, pool, set) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migration %d of %d: %v", i+1, procs, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM probe_schema_version WHERE version_id > 0`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("got %d versions recorded, want 2", n)
	}
}

// TestEnsure: Ensure creates a missing database and finds an existing one
// (as a second start does); a name that is no identifier is refused.
func TestEnsure(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("pmtest_ensure_%d", os.Getpid())
	t.Cleanup(func() { _ = pgdb.Drop(context.Background(), pgtest.AdminURL(), name) })
	for i := range 2 {
		u, err := pgdb.Ensure(ctx, pgtest.AdminURL(), name)
		if err != nil {
			t.Fatalf("ensure %d: %v", i+1, err)
		}
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatalf("ensure %d: its URL: %v", i+1, err)
		}
		_ = conn.Close(ctx)
	}
	if _, err := pgdb.Ensure(ctx, pgtest.AdminURL(), "no; drop"); err == nil {
		t.Error("a name that is no identifier: no error")
	}
}

// TestWithDatabase: the database of a URL is replaced, a multi-host URL's
// hosts and options kept; anything but a postgres:// URL is refused.
func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:p@db:5432/postgres?sslmode=verify-full":                                             "postgres://u:p@db:5432/paymesh_eu?sslmode=verify-full",
		"postgres://u:p@db-1:5432,db-2:5432/postgres?sslmode=verify-full&target_session_attrs=read-write": "postgres://u:p@db-1:5432,db-2:5432/paymesh_eu?sslmode=verify-full&target_session_attrs=read-write",
		"postgresql://db": "postgresql://db/paymesh_eu",
	} {
		if got, err := pgdb.WithDatabase(in, "paymesh_eu"); err != nil || got != want {
			t.Errorf("%s: got %q (%v), want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"mysql://db/x", "db:5432", "postgres://db:port/x"} {
		if got, err := pgdb.WithDatabase(bad, "paymesh_eu"); err == nil {
			t.Errorf("%s: got %q, want an error", bad, got)
		}
	}
}
