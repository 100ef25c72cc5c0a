package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// partitionLock serialises Maintain across processes sharing a database.
const partitionLock = 0x70617964 // "payd"

// Maintenance reports what one Maintain run changed.
type Maintenance struct {
	Created []string
	Dropped []string
}

// maintainLockTimeout bounds how long a partition change may queue for its
// lock on dedup_log. Claims queue behind a waiting partition change, so the
// wait must stay short; partitions are made days ahead, so a change that
// gives up is simply retried at the next run.
const maintainLockTimeout = "2s"

// Maintain creates the day partitions from the retention horizon up to
// AheadDays after today, and drops partitions wholly before the horizon. An
// expired partition is first detached CONCURRENTLY, which does not block
// claims, then dropped. It is idempotent and safe to run from several
// processes at once (a session advisory lock serialises it). It returns the
// first database error; what it changed before that is reported too.
func (l *Log) Maintain(ctx context.Context, pool *pgxpool.Pool) (Maintenance, error) {
	var m Maintenance
	now := l.cfg.Now()
	lo, hi := l.horizon(now), day(now).AddDate(0, 0, l.cfg.AheadDays)
	conn, err := lockPartitions(ctx, pool)
	if err != nil {
		return m, err
	}
	defer unlockPartitions(conn)
	existing, err := partitions(ctx, conn)
	if err != nil {
		return m, err
	}
	// Create first: claims need tomorrow's partition more than anyone needs
	// an old one gone.
	if m.Created, err = createPartitions(ctx, conn, existing, lo, hi); err != nil {
		return m, err
	}
	m.Dropped, err = dropPartitions(ctx, conn, existing, lo)
	return m, err
}

// lockPartitions acquires a connection that holds the advisory lock
// serialising Maintain, with the short lock timeout of partition changes.
// unlockPartitions gives it back.
func lockPartitions(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("dedup: maintain: %w", err)
	}
	for _, sql := range []string{`SELECT pg_advisory_lock(` + fmt.Sprint(partitionLock) + `)`, `SET lock_timeout = '` + maintainLockTimeout + `'`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			conn.Conn().Close(ctx) //nolint:errcheck // discard a connection in an unknown state
			conn.Release()
			return nil, fmt.Errorf("dedup: maintain: %w", err)
		}
	}
	return conn, nil
}

// unlockPartitions releases the advisory lock and the lock timeout of a
// connection from lockPartitions, and returns it to its pool. It runs even
// when the caller's context has ended.
func unlockPartitions(conn *pgxpool.Conn) {
	defer conn.Release()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `RESET lock_timeout; SELECT pg_advisory_unlock(`+fmt.Sprint(partitionLock)+`)`); err != nil {
		conn.Conn().Close(ctx) //nolint:errcheck // the lock dies with the session
	}
}

// createPartitions creates the partitions of the days from lo to hi that
// do not exist yet, and returns the names of those it created.
func createPartitions(ctx context.Context, conn *pgxpool.Conn, existing map[string]partition, lo, hi time.Time) ([]string, error) {
	var created []string
	for d := lo; !d.After(hi); d = d.AddDate(0, 0, 1) {
		name := PartitionName(d)
		if _, ok := existing[name]; ok {
			continue
		}
		if err := createPartition(ctx, conn, name, d); err != nil {
			return created, err
		}
		created = append(created, name)
	}
	return created, nil
}

// createPartition creates the partition name of day d. It is built as a
// plain table with a CHECK of its range, then attached: ATTACH takes a lock
// that does not conflict with claims (CREATE TABLE … PARTITION OF would
// block them). It finishes what an interrupted earlier run began.
func createPartition(ctx context.Context, conn *pgxpool.Conn, name string, d time.Time) error {
	ident := pgx.Identifier{name}.Sanitize()
	from, to := d.Format(time.DateOnly), d.AddDate(0, 0, 1).Format(time.DateOnly)
	for _, sql := range []string{
		`CREATE TABLE IF NOT EXISTS ` + ident + ` (LIKE dedup_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s CHECK (origin_day >= '%s' AND origin_day < '%s')`,
			ident, pgx.Identifier{name + "_range"}.Sanitize(), from, to),
		fmt.Sprintf(`ALTER TABLE dedup_log ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, ident, from, to),
	} {
		if _, err := conn.Exec(ctx, sql); err != nil && !isDuplicateObject(err) {
			return fmt.Errorf("dedup: create %s: %w", name, err)
		}
	}
	return nil
}

// dropPartitions drops the partitions wholly before the horizon lo, and
// returns the names of those it dropped.
func dropPartitions(ctx context.Context, conn *pgxpool.Conn, existing map[string]partition, lo time.Time) ([]string, error) {
	var dropped []string
	for _, name := range detachOrder(existing) {
		p := existing[name]
		if !p.day.Before(lo) {
			continue
		}
		if err := dropPartition(ctx, conn, name, p); err != nil {
			return dropped, err
		}
		dropped = append(dropped, name)
	}
	return dropped, nil
}

// detachOrder returns the names of the partitions in the order to detach
// them: Postgres allows one pending detach per table, so an interrupted one
// comes first, to be finished before the next starts.
func detachOrder(existing map[string]partition) []string {
	names := slices.Collect(maps.Keys(existing))
	slices.SortFunc(names, func(a, b string) int {
		pa, pb := existing[a], existing[b]
		if pa.detachPending != pb.detachPending {
			if pa.detachPending {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

// dropPartition detaches the partition name CONCURRENTLY, or finishes its
// interrupted detach, and drops it.
func dropPartition(ctx context.Context, conn *pgxpool.Conn, name string, p partition) error {
	ident := pgx.Identifier{name}.Sanitize()
	detach := `ALTER TABLE dedup_log DETACH PARTITION ` + ident + ` CONCURRENTLY`
	if p.detachPending { // an earlier detach was interrupted
		detach = `ALTER TABLE dedup_log DETACH PARTITION ` + ident + ` FINALIZE`
	}
	if _, err := conn.Exec(ctx, detach); err != nil {
		return fmt.Errorf("dedup: detach %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, `DROP TABLE `+ident); err != nil {
		return fmt.Errorf("dedup: drop %s: %w", name, err)
	}
	return nil
}

// RunRetention calls Maintain now and then every interval until ctx ends,
// logging failures; a failed run is retried at the next tick.
func (l *Log) RunRetention(ctx context.Context, pool *pgxpool.Pool, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if m, err := l.Maintain(ctx, pool); err != nil {
			log.Error("dedup retention failed", "err", err)
		} else if len(m.Created)+len(m.Dropped) > 0 {
			log.Info("dedup retention", "created", m.Created, "dropped", m.Dropped)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PartitionName is the table name of the partition holding day d.
func PartitionName(d time.Time) string { return "dedup_log_p" + day(d).Format("20060102") }

type partition struct {
	day           time.Time
	detachPending bool
}

// partitions lists the existing day partitions of dedup_log by name.
func partitions(ctx context.Context, conn *pgxpool.Conn) (map[string]partition, error) {
	rows, err := conn.Query(ctx, `
		SELECT c.relname, i.inhdetachpending FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'dedup_log'::regclass`)
	if err != nil {
		return nil, fmt.Errorf("dedup: list partitions: %w", err)
	}
	out := map[string]partition{}
	var name string
	var pending bool
	_, err = pgx.ForEachRow(rows, []any{&name, &pending}, func() error {
		suffix, ok := strings.CutPrefix(name, "dedup_log_p")
		d, err := time.Parse("20060102", suffix)
		if !ok || err != nil {
			return fmt.Errorf("dedup: unexpected partition %q", name)
		}
		out[name] = partition{day: d, detachPending: pending}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dedup: list partitions: %w", err)
	}
	return out, nil
}

// isDuplicateObject reports a constraint left by an interrupted earlier run.
func isDuplicateObject(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42710"
}
