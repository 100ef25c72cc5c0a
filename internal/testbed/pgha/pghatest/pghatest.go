// Package pghatest holds what tests that run a pg_auto_failover formation
// share.
package pghatest

import (
	"context"
	"os"
	"testing"

	"github.com/paymesh/paymesh/internal/testbed/pgha"
)

// Require skips the test under -short, or when pg_auto_failover is not
// installed, unless PAYMESH_REQUIRE_PGHA is set (CI), where it fails the
// test instead.
func Require(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("-short: starts a pg_auto_failover formation")
	}
	if err := pgha.Available(); err != nil {
		if os.Getenv("PAYMESH_REQUIRE_PGHA") != "" {
			tb.Fatalf("PAYMESH_REQUIRE_PGHA is set: %v", err)
		}
		tb.Skipf("%v", err)
	}
}

// MustStart starts a formation with o for the test (Require first), and
// stops it when the test ends; it fails the test when the formation does
// not start.
func MustStart(tb testing.TB, o pgha.Options) *pgha.Formation {
	tb.Helper()
	Require(tb)
	f, err := pgha.Start(context.Background(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = f.Stop() })
	return f
}
