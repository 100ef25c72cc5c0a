package nodelease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
)

// OpenGenerator is how a service gets its ID generator: it checks the
// region and node against regions, applies the lease migrations, leases
// cfg.Node (Acquire) and returns a Generator that mints after the node's
// high-water time and only while the lease holds, with the lease's renewals
// started. The caller releases the lease at Close. It returns the errors of
// idgen.NewGenerator, the migration's, or Acquire's.
func OpenGenerator(ctx context.Context, pool *pgxpool.Pool, regions *idgen.Regions, cfg Config) (*idgen.Generator, *Lease, error) {
	if _, err := idgen.NewGenerator(regions, cfg.Region, cfg.Node); err != nil {
		return nil, nil, err
	}
	if err := pgdb.Migrate(ctx, pool, Migrations()); err != nil {
		return nil, nil, err
	}
	l, err := acquireWaiting(ctx, pool, cfg)
	if err != nil {
		return nil, nil, err
	}
	gen, err := idgen.NewGeneratorWith(regions, cfg.Region, cfg.Node, idgen.GeneratorConfig{Floor: l.Floor(), Permit: l.Err})
	if err != nil {
		return nil, nil, fmt.Errorf("%w (lease: %w)", err, l.Release(context.WithoutCancel(ctx)))
	}
	l.Start(gen.HighWater)
	return gen, l, nil
}

// acquireWaiting is Acquire, waiting up to cfg.HeldWait for a lease held by
// another holder to end. It logs the wait once.
func acquireWaiting(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Lease, error) {
	wait := cfg.HeldWait
	if wait <= 0 {
		ttl := cfg.TTL
		if ttl <= 0 {
			ttl = DefaultTTL
		}
		wait = 2 * ttl
	}
	deadline := time.Now().Add(wait)
	logged := false
	for {
		l, err := Acquire(ctx, pool, cfg)
		if !errors.Is(err, ErrHeld) || time.Now().After(deadline) {
			return l, err
		}
		if !logged && cfg.Log != nil {
			cfg.Log.Info("waiting for the node lease to end (a crashed holder's lease ends a TTL after its last renewal)",
				"region", cfg.Region, "node", cfg.Node, "err", err, "up_to", time.Until(deadline).Round(time.Second))
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
