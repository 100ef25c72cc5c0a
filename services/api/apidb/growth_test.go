package apidb_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestKeyGrowth measures the bytes idempotency_keys grows by per million
// API transfers: PAYMESH_GROWTH keys, each claimed as the API claims one
// (StartKey) and answered by the ledger's apply transaction with the
// transfer's rendered response, as in production; then the keys' TTL
// passes and the cleanup deletes them. It is a measurement, not a check: it
// runs only when PAYMESH_GROWTH is set.
func TestKeyGrowth(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PAYMESH_GROWTH"))
	if n <= 0 {
		t.Skip("set PAYMESH_GROWTH=<transfers> to measure table growth")
	}
	f, store := fixture(t)
	ctx := context.Background()
	accounts := make([]string, 100)
	for i := range accounts {
		accounts[i] = f.Account(t, "EUR", 1<<40)
	}
	size := func() (bytes, rows int64) {
		t.Helper()
		if err := f.Pool.QueryRow(ctx, `SELECT pg_total_relation_size('idempotency_keys'), (SELECT count(*) FROM idempotency_keys)`).Scan(&bytes, &rows); err != nil {
			t.Fatal(err)
		}
		return bytes, rows
	}
	before, _ := size()
	const ttl = 24 * time.Hour
	const batch = 250
	for done := 0; done < n; done += batch {
		cmds := make([]ledger.Command, min(batch, n-done))
		for i := range cmds {
			cmds[i] = f.Transfer(t, accounts[(done+i)%len(accounts)], accounts[(done+i+1)%len(accounts)], 1)
		}
		// Claimed eight at a time, as concurrent requests would.
		errs := make([]error, len(cmds))
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < len(cmds); i += 8 {
					c := cmds[i]
					_, errs[i] = store.StartKey(ctx, api.KeyClaim{Client: c.ClientID, Key: c.IdempotencyKey, Fingerprint: c.Fingerprint(),
						TransferID: c.TransferID, Now: f.Clock.Now(), Lease: time.Minute, TTL: ttl}, c.From)
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for i, r := range f.Apply(t, cmds...) {
			if r.Kind != ledger.Applied {
				t.Fatalf("transfer %d: %v %v", done+i, r.Kind, r.Err)
			}
		}
	}
	grown, rows := size()
	if rows != int64(n) || f.Count(t, `SELECT count(*) FROM idempotency_keys WHERE state = 'done'`) != n {
		t.Fatalf("%d keys, want %d, all answered", rows, n)
	}
	perMillion := func(b int64) float64 { return float64(b) / float64(n) * 1e6 / (1 << 20) }
	t.Logf("idempotency_keys: %d keys answered, %.0f MB per million (%d bytes a key, indexes included)",
		n, perMillion(grown-before), (grown-before)/int64(n))

	f.Clock.Step(ttl + time.Minute)
	deleted, err := store.DeleteExpiredKeys(ctx, f.Clock.Now())
	if err != nil || deleted != int64(n) {
		t.Fatalf("cleanup: deleted %d %v, want %d", deleted, err, n)
	}
	if _, err := f.Pool.Exec(ctx, `VACUUM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	after, rows := size()
	t.Logf("after the TTL: %d keys deleted, %d left; the table keeps %.0f MB per million as free space that new keys reuse",
		deleted, rows, perMillion(after-before))
}
