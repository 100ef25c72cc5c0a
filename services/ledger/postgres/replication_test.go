package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgha"
	"github.com/paymesh/paymesh/internal/testbed/pgha/pghatest"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// TestReplicationSingleServer: a database without standbys, never failed
// over.
func TestReplicationSingleServer(t *testing.T) {
	_, url := pgtest.MustDatabase(t, postgres.Migrations()...)
	pool, err := postgres.Connect(context.Background(), url, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := postgres.New(pool, postgres.Config{Region: "eu"}).Replication(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Server == "" || r.Timeline < 1 || r.Standbys != 0 || r.Synchronous != 0 || r.LagBytes != 0 {
		t.Fatalf("got %+v, want a server, a timeline and no standby", r)
	}
}

// TestReplicationFailover reads the replication state of a pg_auto_failover
// formation through its multi-host URL: the primary with its synchronous
// standby on timeline 1; after the primary is killed, the other server on
// timeline 2 with no standby; once the killed node has rejoined wiped, a
// synchronous standby again.
func TestReplicationFailover(t *testing.T) {
	ctx := context.Background()
	f := pghatest.MustStart(t, pgha.Options{})
	pool, err := postgres.Connect(ctx, f.URL("postgres"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store := postgres.New(pool, postgres.Config{Region: "eu"})
	// until waits for the state want says is reached, and returns it.
	until := func(what string, want func(postgres.Replication) bool) postgres.Replication {
		t.Helper()
		var r postgres.Replication
		var err error
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if r, err = store.Replication(ctx); err == nil && want(r) {
				return r
			}
		}
		t.Fatalf("waiting for %s: last %+v (%v)", what, r, err)
		return r
	}
	old, _ := f.Primary(ctx)
	at := func(n *pgha.Node) string { return fmt.Sprintf("127.0.0.1:%d", n.Port) }
	r := until("the primary with its standby", func(r postgres.Replication) bool { return r.Synchronous == 1 })
	if r.Server != at(old) || r.Timeline != 1 || r.Standbys != 1 || r.LagBytes < 0 {
		t.Fatalf("before the failover: %+v, want %s on timeline 1 with one synchronous standby", r, at(old))
	}
	if err := f.Kill(old); err != nil {
		t.Fatal(err)
	}
	p, err := f.WaitPrimary(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	r = until("the new primary", func(r postgres.Replication) bool { return r.Server == at(p) })
	if r.Timeline != 2 || r.Synchronous != 0 {
		t.Fatalf("after the failover: %+v, want %s on timeline 2 with no synchronous standby", r, at(p))
	}
	if err := f.Rejoin(ctx, old); err != nil {
		t.Fatal(err)
	}
	r = until("the rejoined standby", func(r postgres.Replication) bool { return r.Synchronous == 1 })
	if r.Server != at(p) || r.Timeline != 2 || r.Standbys != 1 {
		t.Fatalf("after the rejoin: %+v, want %s on timeline 2 with one synchronous standby", r, at(p))
	}
}
