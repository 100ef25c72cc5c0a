// Package nodelease leases a pkg/idgen node id in a region's Postgres, so
// that two processes never mint with the same machine id, and persists the
// node's high-water time with the lease, so that a process whose clock is
// behind the IDs minted before it does not mint them again.
//
// A lease is a row of node_leases (its own migration set, Migrations).
// Acquire takes the row in one statement when it is free or expired; the
// holder renews it in the background (Start) and stops minting when a
// renewal has not succeeded for a TTL (Err fails closed); Release hands it
// back at once. Expiry is judged by the database's clock, the high-water
// time by the holder's (Config.Now).
package nodelease

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/platform/pgdb"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationTable records which of the lease migrations a database has.
const MigrationTable = "node_lease_schema_version"

// Migrations returns the lease table's migration set. It refers to no other
// table; every process that leases a node applies it at start.
func Migrations() pgdb.Migration {
	sub, _ := fs.Sub(migrationFiles, "migrations") // cannot fail: the path is embedded
	return pgdb.Migration{FS: sub, Table: MigrationTable}
}

// Errors of Acquire and Err.
var (
	// ErrHeld is returned by Acquire when a live holder has the node.
	ErrHeld = errors.New("node id is leased by a live holder")
	// ErrClockBehind is returned by Acquire when the process's clock is
	// behind the node's high-water time by more than Config.MaxClockWait.
	ErrClockBehind = errors.New("clock behind the node's high-water time")
	// ErrLost is returned by Err once the lease can no longer be trusted:
	// no renewal succeeded for a TTL, another process took the node, or
	// the lease was released.
	ErrLost = errors.New("node lease lost")
)

// Defaults of Config. The TTL is short because a process restarted after
// a crash waits for its dead lease to end, and costs little: a holder that
// cannot renew for a TTL has lost its Postgres, without which neither the
// ledger nor the API can serve anyway.
const (
	DefaultTTL          = 5 * time.Second
	DefaultMaxClockWait = 5 * time.Second
)

// Config says which node to lease and how.
type Config struct {
	Region string
	Node   uint16
	// Holder names this process in the table and in other processes'
	// errors (service, host, pid).
	Holder string
	// TTL is how long a lease outlives its last renewal (default
	// DefaultTTL); it is renewed every TTL/3. A crashed holder's node is
	// free again a TTL after its last renewal.
	TTL time.Duration
	// MaxClockWait bounds how long Acquire waits for the clock to pass the
	// node's high-water time (default DefaultMaxClockWait); past it Acquire
	// refuses with ErrClockBehind.
	MaxClockWait time.Duration
	// HeldWait bounds how long OpenGenerator waits for a lease held by
	// another holder to end (default 2 TTL): a process restarted after a
	// crash finds its own dead lease, which ends a TTL after its last
	// renewal. A live holder renews, so a second process on its node is
	// still refused, after HeldWait.
	HeldWait time.Duration
	// Now is the clock IDs are minted by (default time.Now).
	Now func() time.Time
	Log *slog.Logger
}

// Lease is a held node id. Its methods are safe for concurrent use.
type Lease struct {
	cfg   Config
	pool  *pgxpool.Pool
	token string
	floor time.Time
	base  time.Time    // monotonic origin of deadline
	until atomic.Int64 // local deadline, ns since base; 0 once lost
	lost  atomic.Pointer[error]

	stop context.CancelFunc
	wg   sync.WaitGroup
	hw   func() time.Time
}

// Acquire leases cfg.Node in cfg.Region: in one statement when the node is
// free or its lease expired. It then waits, up to cfg.MaxClockWait, for
// cfg.Now to pass the high-water time the last holder left. It returns an
// error wrapping ErrHeld (naming the holder and its expiry) when a live
// process holds the node, ErrClockBehind (releasing the lease again) when
// the clock is further behind, or the database's error.
func Acquire(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Lease, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxClockWait <= 0 {
		cfg.MaxClockWait = DefaultMaxClockWait
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Node > 1023 {
		return nil, fmt.Errorf("node lease %s/%d: node outside 0..1023", cfg.Region, cfg.Node)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	l := &Lease{cfg: cfg, pool: pool, token: hex.EncodeToString(b[:]), base: time.Now()}
	start := time.Since(l.base)
	// The old row's high_water survives the update, so RETURNING gives
	// the floor this holder must mint after.
	err := pool.QueryRow(ctx, `
INSERT INTO node_leases AS l (region, node, holder, token, lease_until, high_water)
VALUES ($1, $2, $3, $4, now() + $5 * interval '1 microsecond', 'epoch')
ON CONFLICT (region, node) DO UPDATE
   SET holder = excluded.holder, token = excluded.token, lease_until = excluded.lease_until,
       acquired_at = now(), renewed_at = now()
 WHERE l.lease_until <= now()
RETURNING l.high_water`, cfg.Region, int(cfg.Node), cfg.Holder, l.token, cfg.TTL.Microseconds()).Scan(&l.floor)
	if errors.Is(err, pgx.ErrNoRows) {
		var holder string
		var until time.Time
		if err := pool.QueryRow(ctx, `SELECT holder, lease_until FROM node_leases WHERE region = $1 AND node = $2`,
			cfg.Region, int(cfg.Node)).Scan(&holder, &until); err != nil {
			return nil, fmt.Errorf("node lease %s/%d: read holder: %w", cfg.Region, cfg.Node, err)
		}
		return nil, fmt.Errorf("node lease %s/%d: held by %q until %s: %w", cfg.Region, cfg.Node, holder, until.UTC().Format(time.RFC3339), ErrHeld)
	}
	if err != nil {
		return nil, fmt.Errorf("node lease %s/%d: acquire: %w", cfg.Region, cfg.Node, err)
	}
	l.until.Store(int64(start + cfg.TTL))
	if err := l.waitClock(ctx); err != nil {
		return nil, errors.Join(err, l.Release(context.WithoutCancel(ctx)))
	}
	return l, nil
}

// tick is idgen's time unit: an ID after the floor is in a later tick.
const tick = 10 * time.Millisecond

// waitClock waits for cfg.Now to pass the floor's tick, up to MaxClockWait.
func (l *Lease) waitClock(ctx context.Context) error {
	target := l.floor.Add(tick)
	behind := target.Sub(l.cfg.Now())
	if behind < 0 {
		return nil
	}
	if behind > l.cfg.MaxClockWait {
		return fmt.Errorf("node lease %s/%d: clock %s is %s behind the node's high-water time %s (more than the %s this process waits): %w",
			l.cfg.Region, l.cfg.Node, l.cfg.Now().UTC().Format(time.RFC3339Nano), behind, l.floor.UTC().Format(time.RFC3339Nano), l.cfg.MaxClockWait, ErrClockBehind)
	}
	l.cfg.Log.Warn("clock behind the node's high-water time: waiting", "region", l.cfg.Region, "node", l.cfg.Node, "behind", behind)
	deadline := time.Now().Add(l.cfg.MaxClockWait)
	for !l.cfg.Now().After(target) {
		if time.Now().After(deadline) {
			return fmt.Errorf("node lease %s/%d: clock still behind the node's high-water time %s after %s: %w",
				l.cfg.Region, l.cfg.Node, l.floor.UTC().Format(time.RFC3339Nano), l.cfg.MaxClockWait, ErrClockBehind)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(10*time.Millisecond, max(behind, time.Millisecond))):
		}
	}
	return nil
}

// Node returns the leased node id.
func (l *Lease) Node() uint16 { return l.cfg.Node }

// Floor returns the high-water time the previous holders left: IDs minted
// under this lease must be after it (idgen.GeneratorConfig.Floor). It is
// the zero time for a node never leased before.
func (l *Lease) Floor() time.Time {
	if l.floor.Unix() <= 0 {
		return time.Time{}
	}
	return l.floor
}

// Err returns nil while the lease is held and an error wrapping ErrLost
// once no renewal succeeded for a TTL, another holder took the node, or
// the lease was released. It does no I/O: hand it to
// idgen.GeneratorConfig.Permit.
func (l *Lease) Err() error {
	if p := l.lost.Load(); p != nil {
		return *p
	}
	if int64(time.Since(l.base)) >= l.until.Load() {
		return fmt.Errorf("node lease %s/%d: not renewed for %s: %w", l.cfg.Region, l.cfg.Node, l.cfg.TTL, ErrLost)
	}
	return nil
}

// reserve returns the high-water time to persist while the lease is held:
// what was minted, and the clock a TTL ahead, which this holder will not
// mint past before its next renewal or the lease's end.
func (l *Lease) reserve() time.Time {
	t := l.cfg.Now().Add(l.cfg.TTL)
	if l.hw != nil {
		t = later(t, l.hw())
	}
	return later(t, l.floor)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Start renews the lease every TTL/3 until Release, persisting the
// high-water time reported by highWater (the Generator's HighWater) and the
// clock a TTL ahead.
func (l *Lease) Start(highWater func() time.Time) {
	l.hw = highWater
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	// The first renewal persists the reservation at once.
	_ = l.Renew(ctx)
	l.wg.Go(func() {
		t := time.NewTicker(l.cfg.TTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := l.Renew(ctx); err != nil && ctx.Err() == nil {
				l.cfg.Log.Error("node lease renewal failed", "region", l.cfg.Region, "node", l.cfg.Node, "err", err)
			}
		}
	})
}

// Renew extends the lease by a TTL and persists the high-water time. It
// returns an error wrapping ErrLost (and Err reports it from then on) when
// another holder has the node, or the database's error (Err then fails a
// TTL after the last successful renewal).
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.lostErr(); err != nil {
		return err
	}
	start := time.Since(l.base)
	tag, err := l.pool.Exec(ctx, `
UPDATE node_leases SET lease_until = now() + $4 * interval '1 microsecond', renewed_at = now(), high_water = greatest(high_water, $5)
 WHERE region = $1 AND node = $2 AND token = $3`, l.cfg.Region, int(l.cfg.Node), l.token, l.cfg.TTL.Microseconds(), l.reserve())
	if err != nil {
		return fmt.Errorf("node lease %s/%d: renew: %w", l.cfg.Region, l.cfg.Node, err)
	}
	if tag.RowsAffected() == 0 {
		err := fmt.Errorf("node lease %s/%d: taken by another holder: %w", l.cfg.Region, l.cfg.Node, ErrLost)
		l.lost.CompareAndSwap(nil, &err)
		return err
	}
	l.until.Store(int64(start + l.cfg.TTL))
	return nil
}

func (l *Lease) lostErr() error {
	if p := l.lost.Load(); p != nil {
		return *p
	}
	return nil
}

// Release stops the renewals and hands the node back at once, persisting
// as high-water time the greatest ID time minted (a restart then need not
// wait). From then on Err returns ErrLost. It returns the database's
// error; the lease then expires a TTL after its last renewal.
func (l *Lease) Release(ctx context.Context) error {
	if l.stop != nil {
		l.stop()
		l.wg.Wait()
	}
	if err := l.lostErr(); err != nil {
		return nil // not ours any more
	}
	released := fmt.Errorf("node lease %s/%d: released: %w", l.cfg.Region, l.cfg.Node, ErrLost)
	l.lost.Store(&released)
	// While the token is ours nobody else wrote high_water: the
	// reservation a TTL ahead is dropped for what was minted.
	hw := l.floor
	if l.hw != nil {
		hw = later(hw, l.hw())
	}
	_, err := l.pool.Exec(ctx, `
UPDATE node_leases SET lease_until = now(), high_water = $4
 WHERE region = $1 AND node = $2 AND token = $3`, l.cfg.Region, int(l.cfg.Node), l.token, hw)
	if err != nil {
		return fmt.Errorf("node lease %s/%d: release: %w", l.cfg.Region, l.cfg.Node, err)
	}
	return nil
}
