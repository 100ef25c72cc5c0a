package dedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/platform/pgdb"
)

// clock is a steppable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func mustLog(tb testing.TB, cfg dedup.Config) (*dedup.Log, *pgxpool.Pool, *clock) {
	tb.Helper()
	pool, _ := pgtest.MustDatabase(tb, pgdb.Migration{FS: dedup.Migrations(), Table: dedup.MigrationTable})
	clk := &clock{t: time.Now().UTC()}
	cfg.Now = clk.Now
	l := dedup.New(cfg)
	if _, err := l.Maintain(context.Background(), pool); err != nil {
		tb.Fatalf("maintain: %v", err)
	}
	return l, pool, clk
}

// claimTx claims keys in a transaction of its own and commits it.
func claimTx(tb testing.TB, l *dedup.Log, pool *pgxpool.Pool, keys ...dedup.Key) []dedup.Claim {
	tb.Helper()
	ctx := context.Background()
	var out []dedup.Claim
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cs, err := l.ClaimForTx(ctx, tx, "c", keys)
		out = cs
		return err
	})
	if err != nil {
		tb.Fatalf("claim: %v", err)
	}
	return out
}

func outcomes(cs []dedup.Claim) []dedup.Outcome {
	var o []dedup.Outcome
	for _, c := range cs {
		o = append(o, c.Outcome)
	}
	return o
}

func TestClaim(t *testing.T) {
	l, pool, _ := mustLog(t, dedup.Config{Holder: "w1"})
	now := time.Now()
	k := dedup.Key{ID: "m1", Origin: now, Fingerprint: []byte("a")}

	t.Run("First", func(t *testing.T) {
		c := claimTx(t, l, pool, k)[0]
		if c.Outcome != dedup.First {
			t.Fatalf("got %v, want first", c.Outcome)
		}
	})
	t.Run("DuplicateAfterCommit", func(t *testing.T) {
		c := claimTx(t, l, pool, k)[0]
		if c.Outcome != dedup.Duplicate || c.Layer != dedup.LayerTable {
			t.Fatalf("got %v/%s, want duplicate/dedup_table", c.Outcome, c.Layer)
		}
	})
	t.Run("ConflictOnOtherFingerprint", func(t *testing.T) {
		c := claimTx(t, l, pool, dedup.Key{ID: "m1", Origin: now, Fingerprint: []byte("b")})[0]
		if c.Outcome != dedup.Conflict {
			t.Fatalf("got %v, want conflict", c.Outcome)
		}
	})
	t.Run("RepeatInsideBatch", func(t *testing.T) {
		cs := claimTx(t, l, pool,
			dedup.Key{ID: "m2", Origin: now}, dedup.Key{ID: "m2", Origin: now}, k, dedup.Key{ID: "m3", Origin: now})
		got, want := outcomes(cs), []dedup.Outcome{dedup.First, dedup.Duplicate, dedup.Duplicate, dedup.First}
		if !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	})
	t.Run("ErrInvalidKey", func(t *testing.T) {
		for _, bad := range []dedup.Key{{ID: "", Origin: now}, {ID: "x"}} {
			err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
				_, err := l.ClaimForTx(context.Background(), tx, "c", []dedup.Key{bad})
				return err
			})
			if !errors.Is(err, dedup.ErrInvalidKey) {
				t.Errorf("key %+v: got %v, want ErrInvalidKey", bad, err)
			}
		}
	})
	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cs, err := l.ClaimForTx(ctx, tx, "c", []dedup.Key{{ID: "m9", Origin: now}}); err != nil || cs[0].Outcome != dedup.First {
			t.Fatalf("got %v %v, want first", cs, err)
		}
		_ = tx.Rollback(ctx)
		if c := claimTx(t, l, pool, dedup.Key{ID: "m9", Origin: now})[0]; c.Outcome != dedup.First {
			t.Fatalf("after rollback got %v, want first", c.Outcome)
		}
	})
}

// TestConcurrentClaimWaits: a second claimer of a key that is claimed by an
// open transaction waits for it, then sees the key PROCESSED (first
// committed) or gets it (first rolled back).
func TestConcurrentClaimWaits(t *testing.T) {
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "FirstCommits", false: "FirstRollsBack"}[commit]
		t.Run(name, func(t *testing.T) {
			l, pool, _ := mustLog(t, dedup.Config{})
			ctx := context.Background()
			k := dedup.Key{ID: "k", Origin: time.Now()}
			tx1, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c1, err := l.ClaimForTx(ctx, tx1, "c", []dedup.Key{k})
			if err != nil || c1[0].Outcome != dedup.First {
				t.Fatalf("tx1: got %v %v", c1, err)
			}
			done := make(chan dedup.Claim)
			go func() {
				var c dedup.Claim
				_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					cs, err := l.ClaimForTx(ctx, tx, "c", []dedup.Key{k})
					if err != nil {
						return err
					}
					c = cs[0]
					return nil
				})
				done <- c
			}()
			select {
			case c := <-done:
				t.Fatalf("second claim returned %v while the first transaction was open", c.Outcome)
			case <-time.After(300 * time.Millisecond):
			}
			if commit {
				if err := tx1.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				_ = tx1.Rollback(ctx)
			}
			c2 := <-done
			want := map[bool]dedup.Outcome{true: dedup.Duplicate, false: dedup.First}[commit]
			if c2.Outcome != want {
				t.Fatalf("second claim got %v, want %v", c2.Outcome, want)
			}
		})
	}
}

// countingTx wraps a real transaction and counts statements, to show the
// cache answers without touching the table.
type countingTx struct {
	pgx.Tx
	n int
}

func (c *countingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n++
	return c.Tx.Query(ctx, sql, args...)
}

func (c *countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n++
	return c.Tx.Exec(ctx, sql, args...)
}

func TestCache(t *testing.T) {
	cache := dedup.NewCache(2)
	l, pool, _ := mustLog(t, dedup.Config{Cache: cache})
	ctx := context.Background()
	now := time.Now()
	ks := []dedup.Key{{ID: "a", Origin: now, Fingerprint: []byte("1")}, {ID: "b", Origin: now, Fingerprint: []byte("2")}, {ID: "c", Origin: now, Fingerprint: []byte("3")}}
	l.Committed("c", claimTx(t, l, pool, ks...))
	if cache.Len() != 2 {
		t.Fatalf("cache holds %d keys, want 2 (bounded)", cache.Len())
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ct := &countingTx{Tx: tx}
		cs, err := l.ClaimForTx(ctx, ct, "c", ks[1:])
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.Outcome != dedup.Duplicate || c.Layer != dedup.LayerCache {
				t.Errorf("%s: got %v/%s, want duplicate/recent_cache", c.Key.ID, c.Outcome, c.Layer)
			}
		}
		if ct.n != 0 {
			t.Errorf("cache hits ran %d statements, want 0", ct.n)
		}
		// "a" was evicted: the table, not the cache, answers.
		cs, err = l.ClaimForTx(ctx, ct, "c", ks[:1])
		if err != nil || cs[0].Outcome != dedup.Duplicate || cs[0].Layer != dedup.LayerTable {
			t.Errorf("evicted key: got %v %v, want duplicate/dedup_table", cs, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A cached key with another fingerprint is not answered by the cache.
	cs := claimTx(t, l, pool, dedup.Key{ID: "c", Origin: now, Fingerprint: []byte("x")})
	if cs[0].Outcome != dedup.Conflict || cs[0].Layer != dedup.LayerTable {
		t.Fatalf("cached key with another fingerprint: got %v/%s, want conflict/dedup_table", cs[0].Outcome, cs[0].Layer)
	}
}

func TestRetention(t *testing.T) {
	ctx := context.Background()
	l, pool, clk := mustLog(t, dedup.Config{WindowDays: 3, AheadDays: 1})
	count := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'dedup_log'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := count(); got != 4 {
		t.Fatalf("partitions: got %d, want 4 (3-day window + 1 ahead)", got)
	}
	today := clk.Now()
	claimTx(t, l, pool, dedup.Key{ID: "old", Origin: today})

	clk.Step(5 * 24 * time.Hour)
	m, err := l.Maintain(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m.Dropped, dedup.PartitionName(today)) {
		t.Fatalf("dropped %v, want it to include %s", m.Dropped, dedup.PartitionName(today))
	}
	if got := count(); got != 4 {
		t.Fatalf("partitions after 5 days: got %d, want 4", got)
	}
	if m2, err := l.Maintain(ctx, pool); err != nil || len(m2.Created)+len(m2.Dropped) != 0 {
		t.Fatalf("second maintain: got %+v %v, want no change", m2, err)
	}
	// The expired key's row is gone: the consume-log no longer knows it, and
	// an origin before the horizon lands in the oldest live partition.
	c := claimTx(t, l, pool, dedup.Key{ID: "old", Origin: today})[0]
	if c.Outcome != dedup.First {
		t.Fatalf("expired key: got %v, want first (only a business key can catch it now)", c.Outcome)
	}
	if c := claimTx(t, l, pool, dedup.Key{ID: "old", Origin: today})[0]; c.Outcome != dedup.Duplicate {
		t.Fatalf("clamped key seen again: got %v, want duplicate", c.Outcome)
	}
}

// TestRetentionDoesNotBlockClaims: dropping an expired partition while a
// claim transaction is open neither blocks new claims nor loses the
// partition change: a detach that cannot finish yet is finalised by a later
// run.
func TestRetentionDoesNotBlockClaims(t *testing.T) {
	ctx := context.Background()
	l, pool, clk := mustLog(t, dedup.Config{WindowDays: 2, AheadDays: 1})
	old := clk.Now()
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx) //nolint:errcheck
	if _, err := l.ClaimForTx(ctx, open, "c", []dedup.Key{{ID: "held", Origin: old}}); err != nil {
		t.Fatal(err)
	}
	clk.Step(3 * 24 * time.Hour) // today's partition is now expired

	maintained := make(chan error, 1)
	go func() { _, err := l.Maintain(ctx, pool); maintained <- err }()
	waitForDetach(t, pool, maintained)
	start := time.Now()
	claimTx(t, l, pool, dedup.Key{ID: "meanwhile", Origin: clk.Now()})
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a claim waited %s behind retention", d)
	}
	<-maintained // may fail: the open transaction still uses the old partition
	if err := open.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Maintain(ctx, pool); err != nil {
		t.Fatalf("maintain after the transaction ended: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = $1`, dedup.PartitionName(old)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("expired partition still exists (%d, %v)", n, err)
	}
}

// waitForDetach waits, for at most 10 s, until a session of pool's database
// runs a DETACH PARTITION: retention has created today's partition and is
// detaching the expired one. It fails the test if maintained reports that
// the retention run ended first.
func waitForDetach(t *testing.T, pool *pgxpool.Pool, maintained <-chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'ALTER TABLE dedup_log DETACH PARTITION%'`).Scan(&n); err != nil {
			t.Fatalf("read pg_stat_activity: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("retention started no DETACH PARTITION within 10s")
		}
		select {
		case err := <-maintained:
			t.Fatalf("retention ended (%v) before its DETACH PARTITION was seen", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestClaimForTx: a claim's row is PROCESSED once its transaction commits
// (no second write), and answers later claims.
func TestClaimForTx(t *testing.T) {
	l, pool, _ := mustLog(t, dedup.Config{})
	ctx := context.Background()
	k := dedup.Key{ID: "tx-1", Origin: time.Now()}
	if c := claimTx(t, l, pool, k)[0]; c.Outcome != dedup.First {
		t.Fatalf("claim: got %v, want first", c.Outcome)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM dedup_log WHERE consumer = 'c' AND msg_key = $1`, k.ID).Scan(&status); err != nil || status != "PROCESSED" {
		t.Fatalf("status: got %q %v, want PROCESSED", status, err)
	}
	if c := claimTx(t, l, pool, k)[0]; c.Outcome != dedup.Duplicate {
		t.Fatalf("second claim: got %v, want duplicate", c.Outcome)
	}
}

// TestRelease: a released claim leaves no row, so the key is claimed again.
func TestRelease(t *testing.T) {
	l, pool, _ := mustLog(t, dedup.Config{})
	ctx := context.Background()
	k := dedup.Key{ID: "rel-1", Origin: time.Now()}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cs, err := l.ClaimForTx(ctx, tx, "c", []dedup.Key{k})
		if err != nil {
			return err
		}
		return l.Release(ctx, tx, "c", cs)
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := claimTx(t, l, pool, k)[0]; c.Outcome != dedup.First {
		t.Fatalf("after release: got %v, want first", c.Outcome)
	}
}

// TestDuplicateFirst: a duplicate says when its key was first claimed,
// whichever layer answers it: the table (the row's claim time), the recent
// cache (the committed claim's time) and a repeat inside a batch (its
// first's).
func TestDuplicateFirst(t *testing.T) {
	cache := dedup.NewCache(8)
	l, pool, clk := mustLog(t, dedup.Config{Cache: cache})
	origin := clk.Now()
	table, cached := dedup.Key{ID: "t", Origin: origin}, dedup.Key{ID: "k", Origin: origin}
	first := clk.Now().Truncate(time.Microsecond)
	claimTx(t, l, pool, table)
	l.Committed("c", claimTx(t, l, pool, cached))
	clk.Step(90 * time.Minute)
	later := clk.Now().Truncate(time.Microsecond)
	cs := claimTx(t, l, pool, table, cached, dedup.Key{ID: "n", Origin: origin}, dedup.Key{ID: "n", Origin: origin})
	want := []struct {
		layer dedup.Layer
		first time.Time
	}{{dedup.LayerTable, first}, {dedup.LayerCache, first}, {"", time.Time{}}, {dedup.LayerTable, later}}
	for i, w := range want {
		if cs[i].Layer != w.layer || !cs[i].First.Equal(w.first) {
			t.Errorf("claim %d (%s): %s first %v, want %s first %v", i, cs[i].Key.ID, cs[i].Layer, cs[i].First, w.layer, w.first)
		}
	}
}
