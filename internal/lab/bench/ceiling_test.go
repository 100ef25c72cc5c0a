package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCeilingSQLIsApplys holds the ceiling's copies of the apply
// transaction's statements to their sources in services/ledger/postgres:
// each copy, whitespace aside, must appear in the source file it was copied
// from, so that the ceiling measures the SQL the ledger runs.
func TestCeilingSQLIsApplys(t *testing.T) {
	src := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "services", "ledger", "postgres", name))
		if err != nil {
			t.Fatal(err)
		}
		return squash(string(b))
	}
	apply, accounts, transfers, events, store := src("apply.go"), src("accounts.go"), src("transfers.go"), src("events.go"), src("store.go")
	lockCols, lockTail, ok := strings.Cut(ceilingLockSQL, " FROM ")
	if !ok {
		t.Fatalf("ceilingLockSQL %q has no FROM", ceilingLockSQL)
	}
	for _, c := range []struct{ name, copy, in string }{
		{"account columns (accountColumns)", "`" + strings.TrimPrefix(lockCols, "SELECT ") + "`", accounts},
		{"account locks (queueLockState)", "` FROM " + lockTail + "`", apply},
		{"transfers insert (queuePlan)", ceilingTransfersSQL, apply},
		{"postings insert (queuePlan)", ceilingPostingsSQL, apply},
		{"balance compare-and-set (updateBalancesSQL)", ceilingBalancesSQL, apply},
		{"BEGIN (beginQuery)", `"` + ceilingBeginSQL + `"`, store},
		{"transfer columns (transferColumns)", "`" + ceilingTransferColumns + "`", transfers},
		{"business-key lookup (queueExistingTransfers)", "`" + strings.ReplaceAll(ceilingKeysSQL, ceilingTransferColumns, "`+transferColumns+`") + "`", apply},
		{"events insert (insertEventsSQL)", "`" + ceilingEventsSQL + "`", events},
	} {
		if !strings.Contains(c.in, squash(c.copy)) {
			t.Errorf("%s: the ceiling's copy is not in services/ledger/postgres any more:\n%s", c.name, c.copy)
		}
	}
}

// squash collapses every run of white space to one space.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestValidateDatabasePrefix refuses a database prefix that is not a plain
// Postgres identifier, before anything is created.
func TestValidateDatabasePrefix(t *testing.T) {
	for _, p := range []string{"Bench", "my-bench_", "1bench", "bench; DROP", strings.Repeat("b", 41)} {
		if err := (Config{DatabasePrefix: p}).Defaults().Validate(); err == nil || !strings.Contains(err.Error(), "database prefix") {
			t.Errorf("prefix %q: got %v, want a database prefix error", p, err)
		}
	}
	for _, p := range []string{"", "paymesh_bench_", "h6_", strings.Repeat("b", 40)} {
		if err := (Config{DatabasePrefix: p}).Defaults().Validate(); err != nil {
			t.Errorf("prefix %q: %v", p, err)
		}
	}
}
