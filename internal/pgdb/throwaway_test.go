package pgdb_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/pgdb"
)

// TestThrowaway starts a cluster from the local binaries, uses it,
// restarts it in immediate mode on the same URL, and leaves nothing behind.
func TestThrowaway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	tw, err := pgdb.StartThrowaway(ctx)
	if err != nil {
		t.Skipf("no local PostgreSQL binaries: %v", err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("throwaway cluster not reachable: %v", err)
	}
	if _, err := pgdb.Create(ctx, tw.URL, "paymesh_probe", true); err != nil {
		t.Fatal(err)
	}
	if err := tw.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("not reachable after an immediate restart: %v", err)
	}
	if err := tw.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tw.Dir); !os.IsNotExist(err) {
		t.Fatalf("cluster folder %s still exists (%v)", tw.Dir, err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, time.Second); err == nil {
		t.Fatal("the cluster still answers after Stop")
	}
}
