package dedup

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// partitionLock serialises Maintain across processes sharing a database.
const partitionLock = 0x70617964 // "payd"

// Maintenance reports what one Maintain run changed.
type Maintenance struct {
	Created []string
	Dropped []string
}

// Maintain creates the day partitions from the retention horizon up to
// AheadDays after today, and drops partitions wholly before the horizon. It
// is idempotent and safe to run from several processes at once. It returns
// the first database error.
func (l *Log) Maintain(ctx context.Context, db Beginner) (Maintenance, error) {
	var m Maintenance
	now := l.cfg.Now()
	lo, hi := l.horizon(now), day(now).AddDate(0, 0, l.cfg.AheadDays)
	tx, err := db.Begin(ctx)
	if err != nil {
		return m, fmt.Errorf("dedup: maintain: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rollback after commit is a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, partitionLock); err != nil {
		return m, fmt.Errorf("dedup: maintain: %w", err)
	}
	existing, err := partitions(ctx, tx)
	if err != nil {
		return m, err
	}
	for name, d := range existing {
		if d.Before(lo) {
			if _, err := tx.Exec(ctx, `DROP TABLE `+pgx.Identifier{name}.Sanitize()); err != nil {
				return m, fmt.Errorf("dedup: drop %s: %w", name, err)
			}
			m.Dropped = append(m.Dropped, name)
		}
	}
	for d := lo; !d.After(hi); d = d.AddDate(0, 0, 1) {
		name := PartitionName(d)
		if _, ok := existing[name]; ok {
			continue
		}
		sql := fmt.Sprintf(`CREATE TABLE %s PARTITION OF dedup_log FOR VALUES FROM ('%s') TO ('%s')`,
			pgx.Identifier{name}.Sanitize(), d.Format(time.DateOnly), d.AddDate(0, 0, 1).Format(time.DateOnly))
		if _, err := tx.Exec(ctx, sql); err != nil {
			return m, fmt.Errorf("dedup: create %s: %w", name, err)
		}
		m.Created = append(m.Created, name)
	}
	if err := tx.Commit(ctx); err != nil {
		return m, fmt.Errorf("dedup: maintain: %w", err)
	}
	return m, nil
}

// RunRetention calls Maintain now and then every interval until ctx ends,
// logging failures; a failed run is retried at the next tick.
func (l *Log) RunRetention(ctx context.Context, db Beginner, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if m, err := l.Maintain(ctx, db); err != nil {
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

// partitions lists the existing day partitions of dedup_log by name.
func partitions(ctx context.Context, tx pgx.Tx) (map[string]time.Time, error) {
	rows, err := tx.Query(ctx, `
		SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'dedup_log'::regclass`)
	if err != nil {
		return nil, fmt.Errorf("dedup: list partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("dedup: list partitions: %w", err)
	}
	out := make(map[string]time.Time, len(names))
	for _, n := range names {
		suffix, ok := strings.CutPrefix(n, "dedup_log_p")
		d, err := time.Parse("20060102", suffix)
		if !ok || err != nil {
			return nil, fmt.Errorf("dedup: unexpected partition %q", n)
		}
		out[n] = d
	}
	return out, nil
}
