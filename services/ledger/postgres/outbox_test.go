package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// TestPruneOutbox prunes the outbox rows sent longer ago than the
// retention, a batch at a time, and keeps the recently sent rows and every
// unsent one, however old; a pruned step delivered again stays a duplicate,
// and both regions verify.
func TestPruneOutbox(t *testing.T) {
	ctx := context.Background()
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	regions := map[string]*ledgertest.Fixture{"eu": eu, "us": us}
	a := eu.Account(t, "EUR", 1000)
	b := us.Account(t, "EUR", 0)
	age := func(f *ledgertest.Fixture, col string, ago time.Duration) {
		t.Helper()
		if _, err := f.Pool.Exec(ctx, `UPDATE outbox SET `+col+` = now() - $1::interval WHERE `+col+` IS NOT NULL`, ago); err != nil {
			t.Fatal(err)
		}
	}

	// Three transfers sent two days ago, completed through the saga.
	var old []ledger.Command
	for range 3 {
		cmd := eu.Transfer(t, a, b, 10)
		eu.MustApply(t, cmd)
		old = append(old, cmd)
	}
	relay(t, eu, regions)
	relay(t, us, regions)
	age(eu, "sent_at", 48*time.Hour)
	age(us, "sent_at", 48*time.Hour)
	// One sent just now, and one never sent, created two days ago.
	eu.MustApply(t, eu.Transfer(t, a, b, 20))
	relay(t, eu, regions)
	unsent := eu.Transfer(t, a, b, 30)
	eu.MustApply(t, unsent)
	if _, err := eu.Pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '2 days' WHERE sent_at IS NULL`); err != nil {
		t.Fatal(err)
	}

	n, err := eu.Store.PruneOutbox(ctx, 24*time.Hour, 2) // batches of 2: the loop runs twice
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("eu pruned: got %d rows, want 3", n)
	}
	if got := eu.Count(t, `SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL`); got != 1 {
		t.Errorf("eu sent rows kept: got %d, want 1 (the recent one)", got)
	}
	if got := eu.Count(t, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`); got != 1 {
		t.Errorf("eu unsent rows kept: got %d, want 1", got)
	}
	if n, err := us.Store.PruneOutbox(ctx, 24*time.Hour, 0); err != nil || n != 3 {
		t.Errorf("us pruned: got %d rows, %v; want 3, nil", n, err)
	}
	if n, err := eu.Store.PruneOutbox(ctx, 24*time.Hour, 0); err != nil || n != 0 {
		t.Errorf("eu pruned again: got %d rows, %v; want 0, nil", n, err)
	}
	if _, err := eu.Store.PruneOutbox(ctx, -time.Hour, 0); err == nil {
		t.Error("negative retention: got no error")
	}

	// A pruned step delivered again is still a duplicate and queues nothing.
	before := us.Count(t, `SELECT count(*) FROM outbox`) + eu.Count(t, `SELECT count(*) FROM outbox`)
	for _, cmd := range old {
		if r := us.Apply(t, cmd.Step(ledger.TypeCredit, ""))[0]; r.Kind != ledger.Duplicate {
			t.Errorf("pruned credit again: got %v, want duplicate", r.Kind)
		}
		if r := eu.Apply(t, cmd.Step(ledger.TypeConfirm, ""))[0]; r.Kind != ledger.Duplicate {
			t.Errorf("pruned confirm again: got %v, want duplicate", r.Kind)
		}
	}
	if got := us.Count(t, `SELECT count(*) FROM outbox`) + eu.Count(t, `SELECT count(*) FROM outbox`); got != before {
		t.Errorf("outbox rows after the repeats: got %d, want %d", got, before)
	}

	// The kept unsent step still goes out, and the regions verify.
	relay(t, eu, regions)
	relay(t, us, regions)
	if got := transferStatus(t, eu, unsent.TransferID); got.Status != ledger.StatusCompleted {
		t.Errorf("the unsent transfer: got %s, want COMPLETED", got.Status)
	}
	eu.MustVerify(t)
	us.MustVerify(t)
	rep, err := postgres.VerifyGlobal(ctx, []*postgres.Store{eu.Store, us.Store}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("global verify:\n%s", rep)
	}
}

// TestWatchOutbox: the watch signals once it listens, then after the
// commit of a batch that wrote a saga step due now; a batch without one,
// committed before it, is no cause for a signal of its own, and a
// connection killed under the watch is opened again.
func TestWatchOutbox(t *testing.T) {
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	a, a2, b := eu.Account(t, "EUR", 1000), eu.Account(t, "EUR", 0), us.Account(t, "EUR", 0)
	pool, err := postgres.Connect(context.Background(), eu.URL, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	watcher := postgres.New(pool, postgres.Config{Region: "eu", Regions: eu.Regions})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	written := watcher.WatchOutbox(ctx, nil)
	signalled := func(what string) {
		t.Helper()
		select {
		case <-written:
		case <-time.After(30 * time.Second):
			t.Fatalf("no signal %s", what)
		}
	}
	signalled("once listening")
	listener := func() int {
		var pid int
		if err := eu.Pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN `+postgres.OutboxChannel+`' AND datname = current_database()`).Scan(&pid); err != nil {
			t.Fatalf("the listening connection: %v", err)
		}
		return pid
	}

	eu.MustApply(t, eu.Transfer(t, a, a2, 10)) // same region: no step
	eu.MustApply(t, eu.Transfer(t, a, b, 10))  // a credit step for us
	signalled("after a step was committed")
	if n := eu.Count(t, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`); n != 1 {
		t.Fatalf("%d unsent steps, want 1", n)
	}

	old := listener()
	if _, err := eu.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, old); err != nil {
		t.Fatal(err)
	}
	signalled("after the watch connected again")
	if pid := listener(); pid == old {
		t.Fatalf("still listening on the killed connection %d", pid)
	}
	eu.MustApply(t, eu.Transfer(t, a, b, 10))
	signalled("after a step was committed on the new connection")
}
