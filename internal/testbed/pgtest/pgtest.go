// Package pgtest gives each test its own Postgres database on the server named
// by PAYMESH_TEST_POSTGRES_URL (default: the local server), dropped at cleanup.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/platform/pgdb"
)

var seq atomic.Int64

// AdminURL is the server the tests create databases on.
func AdminURL() string {
	if u := os.Getenv("PAYMESH_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return pgdb.DefaultURL
}

// MustDatabase creates a fresh database, applies the migration sets and
// returns a pool on it. The database is dropped when the test ends.
func MustDatabase(tb testing.TB, sets ...pgdb.Migration) (*pgxpool.Pool, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := fmt.Sprintf("pmtest_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6, seq.Add(1))
	url, err := pgdb.Create(ctx, AdminURL(), name, true)
	if err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		tb.Fatalf("open pool: %v", err)
	}
	tb.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pgdb.Drop(ctx, AdminURL(), name); err != nil {
			tb.Errorf("drop test database: %v", err)
		}
	})
	if err := pgdb.Migrate(ctx, pool, sets...); err != nil {
		tb.Fatalf("migrate: %v", err)
	}
	return pool, url
}
