// Package promchecktest holds what tests that run a real Prometheus
// share.
package promchecktest

import (
	"os"
	"testing"

	"github.com/paymesh/paymesh/internal/testbed/promcheck"
)

// Require skips the test when prometheus or promtool is missing, unless
// PAYMESH_REQUIRE_PROMETHEUS is set (CI), where it fails the test.
func Require(tb testing.TB) {
	tb.Helper()
	if err := promcheck.Installed(); err != nil {
		if os.Getenv("PAYMESH_REQUIRE_PROMETHEUS") != "" {
			tb.Fatalf("PAYMESH_REQUIRE_PROMETHEUS is set: %v", err)
		}
		tb.Skipf("%v; run scripts/prometheus as root", err)
	}
}
