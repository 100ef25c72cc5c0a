package postgres_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
)

// growthTables are the tables whose size TestGrowth reports; dedup_log is
// the sum of its partitions.
var growthTables = []string{"transfers", "postings", "accounts", "credits", "outbox", "dedup_log"}

// tableBytes returns pg_total_relation_size of each growth table (for a
// partitioned one, summed over its partitions).
func tableBytes(tb testing.TB, f *ledgertest.Fixture) map[string]int64 {
	tb.Helper()
	out := map[string]int64{}
	for _, t := range growthTables {
		var n int64
		if err := f.Pool.QueryRow(context.Background(),
			`SELECT pg_total_relation_size($1::regclass) + coalesce((SELECT sum(pg_total_relation_size(relid))
			FROM pg_partition_tree($1::regclass) WHERE relid <> $1::regclass), 0)::bigint`, t).Scan(&n); err != nil {
			tb.Fatal(err)
		}
		out[t] = n
	}
	return out
}

// TestGrowth measures the bytes each table grows by per million transfers:
// PAYMESH_GROWTH uniform transfers between 1,000 accounts of one region,
// then PAYMESH_GROWTH/10 cross-region transfers through the saga (every
// step relayed and marked sent, nothing pruned). It is a measurement, not
// a check: it runs only when PAYMESH_GROWTH is set.
func TestGrowth(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PAYMESH_GROWTH"))
	if n <= 0 {
		t.Skip("set PAYMESH_GROWTH=<transfers> to measure table growth")
	}
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	regions := map[string]*ledgertest.Fixture{"eu": eu, "us": us}
	accounts := make([]string, 1000)
	for i := range accounts {
		accounts[i] = eu.Account(t, "EUR", 1<<40)
	}
	dest := make([]string, 100)
	for i := range dest {
		dest[i] = us.Account(t, "EUR", 0)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	batch := func(k int, to func() string) []ledger.Command {
		cmds := make([]ledger.Command, k)
		for i := range cmds {
			from, dst := accounts[rng.IntN(len(accounts))], to()
			for dst == from {
				dst = to()
			}
			cmds[i] = eu.Transfer(t, from, dst, 1+rng.Int64N(1000))
		}
		return cmds
	}
	measure := func(name string, k int, run func()) {
		t.Helper()
		euBefore, usBefore := tableBytes(t, eu), tableBytes(t, us)
		start := time.Now()
		run()
		euAfter, usAfter := tableBytes(t, eu), tableBytes(t, us)
		t.Logf("%s: %d transfers in %v", name, k, time.Since(start).Round(time.Millisecond))
		for _, tab := range growthTables {
			t.Logf("  %-10s source +%9d B, destination +%9d B: %7.1f MB per million (both regions)", tab,
				euAfter[tab]-euBefore[tab], usAfter[tab]-usBefore[tab],
				float64(euAfter[tab]-euBefore[tab]+usAfter[tab]-usBefore[tab])*1e6/float64(k)/1e6)
		}
	}
	const size = 250
	measure("local", n, func() {
		for done := 0; done < n; done += size {
			for _, r := range eu.Apply(t, batch(min(size, n-done), func() string { return accounts[rng.IntN(len(accounts))] })...) {
				if r.Kind != ledger.Applied {
					t.Fatalf("local transfer: got %v %v", r.Kind, r.Err)
				}
			}
		}
	})
	cross := n / 10
	measure("cross-region", cross, func() {
		for done := 0; done < cross; done += size {
			eu.Apply(t, batch(min(size, cross-done), func() string { return dest[rng.IntN(len(dest))] })...)
			for eu.Count(t, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`)+us.Count(t, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`) > 0 {
				relay(t, eu, regions)
				relay(t, us, regions)
			}
		}
	})
	eu.MustVerify(t)
	us.MustVerify(t)
}
