package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxChannel is the Postgres notification channel of the outbox: a
// transaction that writes a row due now notifies it, and Postgres delivers
// the notification when, and only if, the transaction commits.
const OutboxChannel = "paymesh_outbox"

var notifyOutboxSQL = "SELECT pg_notify('" + OutboxChannel + "', '')"

// WatchOutbox listens on OutboxChannel, on a connection of its own taken
// from the store's pool, and sends on the channel it returns after every
// commit that wrote outbox rows due now: coalesced (the channel holds one
// signal, and a signal stands for every commit since the last one read),
// and once each time it (re)connects, for the commits it may have missed.
// A lost connection is opened again after a pause, logged; the caller
// keeps a poll for the rows written meanwhile and for rows that fall due
// later. It stops when ctx ends.
func (s *Store) WatchOutbox(ctx context.Context, log *slog.Logger) <-chan struct{} {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	written := make(chan struct{}, 1)
	signal := func() {
		select {
		case written <- struct{}{}:
		default:
		}
	}
	go func() {
		for ctx.Err() == nil {
			err := s.listen(ctx, signal)
			if ctx.Err() != nil {
				return
			}
			log.Warn("outbox: listen for commits; the relay polls meanwhile", "err", err)
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}()
	return written
}

// listen holds one listening connection until it fails or ctx ends,
// calling signal once it listens and on each notification.
func (s *Store) listen(ctx context.Context, signal func()) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // never back to the pool: it listens
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+OutboxChannel); err != nil {
		return err
	}
	signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal()
	}
}

// OutboxRow is a saga step waiting to be relayed to the ledger of Region.
type OutboxRow struct {
	ID       int64
	MsgID    string // the step's Nats-Msg-Id
	Region   string // the region whose ledger applies it
	Account  string // the account whose shard carries it
	Payload  []byte // the encoded ledger.Command
	Attempts int
	Created  time.Time
	// TraceParent continues the transfer's trace when the step is relayed.
	TraceParent string
}

// PendingOutbox returns up to limit unsent rows, oldest first, and up to
// limit more that are due (a hold's expiry step whose time has come),
// skipping rows for the regions in skip (unreachable ones, so that they
// cannot hold up the others). A row due later waits: the relay cannot send
// it early, and one written while the relay or the ledger was down goes
// out when they are back.
func (s *Store) PendingOutbox(ctx context.Context, limit int, skip ...string) ([]OutboxRow, error) {
	rows, err := s.pool.Query(ctx, `
		(SELECT id, msg_id, region, account, payload, attempts, created_at, trace_parent
		 FROM outbox WHERE sent_at IS NULL AND due_at IS NULL AND NOT (region = ANY($2::text[])) ORDER BY id LIMIT $1)
		UNION ALL
		(SELECT id, msg_id, region, account, payload, attempts, created_at, trace_parent
		 FROM outbox WHERE sent_at IS NULL AND due_at <= $3 AND NOT (region = ANY($2::text[])) ORDER BY due_at LIMIT $1)`,
		limit, append([]string{}, skip...), s.now())
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		err := r.Scan(&o.ID, &o.MsgID, &o.Region, &o.Account, &o.Payload, &o.Attempts, &o.Created, &o.TraceParent)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	return out, nil
}

// MarkSent records that the rows' steps were acked by their destination
// streams. It must only be called after the PubAck: a row marked sent is
// never relayed again.
//
// The mark commits asynchronously (synchronous_commit off for its own
// transaction): COMMIT returns before the WAL is flushed, and the relay's
// next round does not wait for a disk write. A crash or a failover can
// then lose the mark, never a step: the step goes out again, as after a
// crash between the PubAck and the mark, and its destination's Msg-Id
// window and consume-log absorb it. The set_config in the statement
// applies to the statement's own implicit transaction, so one round trip
// does it.
func (s *Store) MarkSent(ctx context.Context, ids []int64) error {
	return markOutbox(ctx, s, "id", ids, true)
}

// MarkFailed counts a failed relay attempt of the rows, committed
// asynchronously as MarkSent's mark: a count lost in a crash is one attempt
// fewer in the row.
func (s *Store) MarkFailed(ctx context.Context, ids []int64) error {
	return markOutbox(ctx, s, "id", ids, false)
}

// MarkStepsSent records that the steps msgIDs (their Nats-Msg-Ids, the
// outbox's msg_id), published by the ledger after the COMMIT that wrote
// them, were acked by their destination streams, as MarkSent does for the
// relay's, and committed asynchronously in the same way.
func (s *Store) MarkStepsSent(ctx context.Context, msgIDs []string) error {
	return markOutbox(ctx, s, "msg_id", msgIDs, true)
}

// MarkStepsFailed counts a failed publish of the steps msgIDs, as
// MarkFailed does for the relay's: the relay sends them once they are due.
func (s *Store) MarkStepsFailed(ctx context.Context, msgIDs []string) error {
	return markOutbox(ctx, s, "msg_id", msgIDs, false)
}

// markOutbox counts an attempt of the unsent rows whose column (id or
// msg_id, both unique) is in keys, and marks them sent when sent, in a
// statement committed asynchronously.
func markOutbox[K int64 | string](ctx context.Context, s *Store, column string, keys []K, sent bool) error {
	if len(keys) == 0 {
		return nil
	}
	set, what := "attempts = attempts + 1", "mark outbox attempt"
	if sent {
		set, what = "sent_at = now(), "+set, "mark outbox sent"
	}
	if _, err := s.pool.Exec(ctx, `UPDATE outbox SET `+set+`
		FROM (SELECT set_config('synchronous_commit', 'off', true)) async
		WHERE `+column+` = ANY($1) AND sent_at IS NULL`, keys); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// OutboxLag returns how many rows wait to be relayed and the age of the
// oldest (a step due later is not waiting yet; a due one waits from its
// due time).
func (s *Store) OutboxLag(ctx context.Context) (unsent int64, oldest time.Duration, err error) {
	var age *time.Duration
	err = s.pool.QueryRow(ctx, `SELECT count(*), max(now() - coalesce(due_at, created_at)) FROM outbox
		WHERE sent_at IS NULL AND (due_at IS NULL OR due_at <= now())`).Scan(&unsent, &age)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox lag: %w", err)
	}
	if age != nil {
		oldest = *age
	}
	return unsent, oldest, nil
}

// InTransit returns how many transfers sourced here are DEBITED (their
// money between regions) and their total amount.
func (s *Store) InTransit(ctx context.Context) (count, amount int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(coalesce(captured_amount, amount)), 0) FROM transfers WHERE status = 'DEBITED'`).Scan(&count, &amount)
	if err != nil {
		return 0, 0, fmt.Errorf("in transit: %w", err)
	}
	return count, amount, nil
}

// InTransitOldest returns the age of the oldest transfer sourced here that
// is still DEBITED (since its creation), 0 when none is; it returns an
// error when the query fails.
func (s *Store) InTransitOldest(ctx context.Context) (time.Duration, error) {
	var age *time.Duration
	if err := s.pool.QueryRow(ctx, `SELECT max(now() - created_at) FROM transfers WHERE status = 'DEBITED'`).Scan(&age); err != nil {
		return 0, fmt.Errorf("in transit oldest: %w", err)
	}
	if age == nil || *age < 0 {
		return 0, nil
	}
	return *age, nil
}

// DefaultOutboxRetention is how long PruneOutbox keeps a sent row: a day of
// relayed steps stays readable (attempts, trace parent, payload) for
// debugging an incident before it is deleted.
const DefaultOutboxRetention = 24 * time.Hour

// DefaultPruneBatch is the most rows one PruneOutbox statement deletes.
const DefaultPruneBatch = 5000

// pruneOutboxSQL deletes, in id order after $1, up to $3 rows that were
// sent (acked by their destination stream) more than $2 ago. Rows locked
// by a concurrent pruner are skipped, not waited for.
const pruneOutboxSQL = `
	DELETE FROM outbox WHERE id IN (
		SELECT id FROM outbox
		WHERE id > $1 AND sent_at IS NOT NULL AND sent_at < now() - $2::interval
		ORDER BY id LIMIT $3
		FOR UPDATE SKIP LOCKED)
	RETURNING id`

// PruneOutbox deletes the outbox rows whose steps were sent more than
// retention ago, batch rows per statement (DefaultPruneBatch when batch is
// not positive), each statement its own short transaction, and returns how
// many it deleted. A sent row is never read again: the relay reads only
// unsent rows, a duplicate step cannot queue its row again (the transfer's
// compare-and-set and the credits key refuse it before the outbox is
// written), and the invariants count only unsent rows. Unsent rows are
// never deleted, however old. It returns the first database error, with
// the count deleted before it.
func (s *Store) PruneOutbox(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	if retention < 0 {
		return 0, fmt.Errorf("prune outbox: negative retention %v", retention)
	}
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	var total, after int64
	for {
		rows, err := s.pool.Query(ctx, pruneOutboxSQL, after, retention, batch)
		if err != nil {
			return total, fmt.Errorf("prune outbox: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return total, fmt.Errorf("prune outbox: %w", err)
		}
		total += int64(len(ids))
		for _, id := range ids {
			after = max(after, id)
		}
		if len(ids) < batch || ctx.Err() != nil {
			return total, nil
		}
	}
}
