package nodelease_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/nodelease"
)

// process opens a pool of its own on url, as a second process would.
func process(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func regions(t *testing.T) *idgen.Regions {
	t.Helper()
	r, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// generator returns a Generator that mints under l, and starts l's renewals.
func generator(t *testing.T, l *nodelease.Lease) *idgen.Generator {
	t.Helper()
	g, err := idgen.NewGeneratorWith(regions(t), "eu", l.Node(), idgen.GeneratorConfig{Floor: l.Floor(), Permit: l.Err})
	if err != nil {
		t.Fatal(err)
	}
	l.Start(g.HighWater)
	return g
}

func TestSecondHolderRefused(t *testing.T) {
	ctx := context.Background()
	_, url := pgtest.MustDatabase(t, nodelease.Migrations())
	a, err := nodelease.Acquire(ctx, process(t, url), nodelease.Config{Region: "eu", Node: 1, Holder: "ledger/a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	_, err = nodelease.Acquire(ctx, process(t, url), nodelease.Config{Region: "eu", Node: 1, Holder: "ledger/b"})
	if !errors.Is(err, nodelease.ErrHeld) || !strings.Contains(err.Error(), `"ledger/a"`) {
		t.Fatalf("second Acquire of eu/1: got %v, want ErrHeld naming ledger/a", err)
	}
	// Another node, or the same node in another region, is free.
	for _, c := range []nodelease.Config{{Region: "eu", Node: 2, Holder: "api/b"}, {Region: "us", Node: 1, Holder: "ledger/us"}} {
		l, err := nodelease.Acquire(ctx, process(t, url), c)
		if err != nil {
			t.Fatalf("Acquire %s/%d: %v", c.Region, c.Node, err)
		}
		_ = l.Release(ctx)
	}
	// Released, the node is free at once.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Err(); !errors.Is(err, nodelease.ErrLost) {
		t.Fatalf("Err after Release = %v, want ErrLost", err)
	}
	b, err := nodelease.Acquire(ctx, process(t, url), nodelease.Config{Region: "eu", Node: 1, Holder: "ledger/b"})
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	_ = b.Release(ctx)
}

// clock is a settable clock that runs on from where it was set.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time       { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Step(d time.Duration) { c.offset.Add(int64(d)) }

func TestRestartWithClockSteppedBack(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.MustDatabase(t, nodelease.Migrations())
	var clk clock
	cfg := nodelease.Config{Region: "eu", Node: 3, Holder: "api/1", Now: clk.Now, MaxClockWait: 500 * time.Millisecond}
	first, err := nodelease.Acquire(ctx, pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	highWater := clk.Now()
	first.Start(func() time.Time { return highWater }) // the last ID minted
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("ErrClockBehind", func(t *testing.T) {
		clk.Step(-time.Hour)
		defer clk.Step(time.Hour)
		_, err := nodelease.Acquire(ctx, pool, cfg)
		if !errors.Is(err, nodelease.ErrClockBehind) {
			t.Fatalf("Acquire with the clock an hour back: got %v, want ErrClockBehind", err)
		}
		t.Log(err)
	})
	t.Run("Waits", func(t *testing.T) {
		clk.Step(-200 * time.Millisecond)
		begin := time.Now()
		l, err := nodelease.Acquire(ctx, pool, cfg) // refused above, released again: free
		if err != nil {
			t.Fatalf("Acquire with the clock 200ms back: %v", err)
		}
		defer l.Release(ctx)
		if waited := time.Since(begin); waited < 100*time.Millisecond {
			t.Fatalf("Acquire returned after %s, want it to wait out the clock (~200ms)", waited)
		}
		if !clk.Now().After(highWater) || !l.Floor().Equal(highWater.Truncate(time.Microsecond)) {
			t.Fatalf("after Acquire: clock %v, floor %v; want both past/at the high water %v", clk.Now(), l.Floor(), highWater)
		}
	})
}

func TestTakeoverAfterExpiry(t *testing.T) {
	ctx := context.Background()
	_, url := pgtest.MustDatabase(t, nodelease.Migrations())
	const ttl = time.Second
	poolA := process(t, url)
	a, err := nodelease.Acquire(ctx, poolA, nodelease.Config{Region: "eu", Node: 5, Holder: "ledger/a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	genA := generator(t, a)
	var maxA idgen.ID
	for range 500 {
		id, err := genA.Next()
		if err != nil {
			t.Fatal(err)
		}
		maxA = max(maxA, id)
	}
	poolA.Close() // a crashes: no more renewals, no release

	b := nodelease.Config{Region: "eu", Node: 5, Holder: "ledger/b", TTL: ttl}
	if _, err := nodelease.Acquire(ctx, process(t, url), b); !errors.Is(err, nodelease.ErrHeld) {
		t.Fatalf("Acquire before a's lease expired: got %v, want ErrHeld", err)
	}
	var lb *nodelease.Lease
	deadline := time.Now().Add(5 * ttl)
	for {
		lb, err = nodelease.Acquire(ctx, process(t, url), b)
		if err == nil {
			break
		}
		if !errors.Is(err, nodelease.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("Acquire after a's lease expired: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer lb.Release(ctx)
	if !lb.Floor().After(maxA.Time()) {
		t.Fatalf("b's floor %v is not after a's last ID time %v", lb.Floor(), maxA.Time())
	}
	// a, cut off, stopped minting a TTL after its last renewal.
	if id, err := genA.Next(); !errors.Is(err, nodelease.ErrLost) {
		t.Fatalf("a's Next after its lease expired = %v, %v; want ErrLost", id, err)
	}
	genB := generator(t, lb)
	for range 500 {
		id, err := genB.Next()
		if err != nil {
			t.Fatal(err)
		}
		if id <= maxA {
			t.Fatalf("b minted %#x, not after a's last ID %#x", uint64(id), uint64(maxA))
		}
	}

	t.Run("ClockSteppedBack", func(t *testing.T) {
		// c could have minted until a TTL after its last renewal, past its
		// last ID: a taker whose clock is behind that is refused, though
		// it is ahead of c's last ID.
		poolC := process(t, url)
		c, err := nodelease.Acquire(ctx, poolC, nodelease.Config{Region: "eu", Node: 6, Holder: "c", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		last, err := generator(t, c).Next()
		if err != nil {
			t.Fatal(err)
		}
		poolC.Close() // c crashes
		time.Sleep(ttl + 100*time.Millisecond)
		// d's clock reads just after c's last ID, however long this took on
		// a loaded machine: behind what c could have minted by a TTL's
		// worth, far more than d waits for it (MaxClockWait).
		var clk clock
		clk.Step(time.Until(last.Time().Add(ttl / 10)))
		d := nodelease.Config{Region: "eu", Node: 6, Holder: "d", TTL: ttl, Now: clk.Now, MaxClockWait: 100 * time.Millisecond}
		if !clk.Now().After(last.Time()) {
			t.Fatalf("test clock %v not after c's last ID %v", clk.Now(), last.Time())
		}
		if _, err := nodelease.Acquire(ctx, process(t, url), d); !errors.Is(err, nodelease.ErrClockBehind) {
			t.Fatalf("Acquire with the clock at c's last ID: got %v, want ErrClockBehind", err)
		}
		d.Now = nil
		l, err := nodelease.Acquire(ctx, process(t, url), d)
		if err != nil {
			t.Fatalf("Acquire with the clock right: %v", err)
		}
		_ = l.Release(ctx)
	})
}

// TestLostToAnotherHolder: a holder whose lease expired and was taken
// cannot renew it back; it stays lost.
func TestLostToAnotherHolder(t *testing.T) {
	ctx := context.Background()
	_, url := pgtest.MustDatabase(t, nodelease.Migrations())
	// A TTL long enough that b, renewed by nobody either, outlives the
	// checks on a loaded machine.
	cfg := nodelease.Config{Region: "eu", Node: 9, Holder: "a", TTL: 3 * time.Second}
	a, err := nodelease.Acquire(ctx, process(t, url), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// a stalls past its TTL.
	for deadline := time.Now().Add(time.Minute); !errors.Is(a.Err(), nodelease.ErrLost); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a.Err a minute past its TTL = %v, want ErrLost", a.Err())
		}
	}
	cfg.Holder = "b"
	// The database ends a's lease by its own clock, a moment after a's
	// process saw it lapse: b asks until it is free.
	var b *nodelease.Lease
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if b, err = nodelease.Acquire(ctx, process(t, url), cfg); err == nil {
			break
		}
		if !errors.Is(err, nodelease.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("Acquire after a's lease lapsed: %v", err)
		}
	}
	defer b.Release(ctx)
	if err := a.Renew(ctx); !errors.Is(err, nodelease.ErrLost) {
		t.Fatalf("a.Renew after b took the node = %v, want ErrLost", err)
	}
	if err := a.Err(); !errors.Is(err, nodelease.ErrLost) || !strings.Contains(err.Error(), "taken") {
		t.Fatalf("a.Err after b took the node = %v, want ErrLost (taken)", err)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("b.Err = %v, want nil", err)
	}
}

// TestRestartAfterCrashWaitsForItsOldLease: a process killed without
// releasing its lease is restarted at once (as a supervisor does) and
// finds its dead lease: OpenGenerator waits for it to end and then mints
// after the old holder's IDs, where a live holder's node stays refused.
func TestRestartAfterCrashWaitsForItsOldLease(t *testing.T) {
	_, url := pgtest.MustDatabase(t)
	ctx := context.Background()
	ttl := 500 * time.Millisecond
	cfg := nodelease.Config{Region: "eu", Node: 7, Holder: "crashed", TTL: ttl}
	oldPool := process(t, url)
	oldGen, _, err := nodelease.OpenGenerator(ctx, oldPool, regions(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	last, err := oldGen.Next()
	if err != nil {
		t.Fatal(err)
	}
	oldPool.Close() // it crashes: no more renewals, no release, as after kill -9

	cfg.Holder = "restarted"
	start := time.Now()
	gen, l, err := nodelease.OpenGenerator(ctx, process(t, url), regions(t), cfg)
	if err != nil {
		t.Fatalf("restart after a crash: got %v, want the old lease waited out", err)
	}
	defer l.Release(ctx)
	if waited := time.Since(start); waited > 3*ttl {
		t.Errorf("waited %s for a lease of %s", waited, ttl)
	}
	id, err := gen.Next()
	if err != nil {
		t.Fatal(err)
	}
	if id <= last {
		t.Fatalf("got ID %d after the crashed holder's %d, want a later one", id, last)
	}

	// A live holder is not waited out: after HeldWait the node is refused.
	cfg.Holder, cfg.HeldWait = "second", 2*ttl
	if _, _, err := nodelease.OpenGenerator(ctx, process(t, url), regions(t), cfg); !errors.Is(err, nodelease.ErrHeld) {
		t.Fatalf("node held by a live process: got %v, want ErrHeld", err)
	}
}
