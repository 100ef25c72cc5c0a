package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Outcome is what a delivery did.
type Outcome string

// The outcomes of a delivery.
const (
	// Applied: the event's effect, and those of the parked events that
	// followed it, were applied.
	Applied Outcome = "applied"
	// Parked: an earlier event of its account has not arrived; it waits.
	Parked Outcome = "parked"
	// Duplicate: the event was received before; nothing was applied.
	Duplicate Outcome = "duplicate"
)

// Cause is why a duplicate came, read from the attempt hints of this
// delivery and the latest before it (a closed set, as paymesh's own dedup layers
// name theirs).
type Cause string

// The causes of a duplicate.
const (
	// CauseRetry: a later attempt of a delivery already applied; paymesh
	// did not get its 2xx in time (lost, or later than its timeout).
	CauseRetry Cause = "retry"
	// CauseRedelivery: the event was asked for again
	// (POST /v1/events/{id}/redeliver).
	CauseRedelivery Cause = "redelivery"
	// CauseParked: the event came again while it was parked.
	CauseParked Cause = "parked"
	// CauseStale: no record of the event, but its account is past it (its
	// record was removed).
	CauseStale Cause = "stale"
	// CauseUnknown: the hints do not say (a sender without them, or the
	// same attempt twice).
	CauseUnknown Cause = "unknown"
)

// Causes lists every cause, in the order of the constants.
func Causes() []Cause {
	return []Cause{CauseRetry, CauseRedelivery, CauseParked, CauseStale, CauseUnknown}
}

// Result is a delivery's outcome: the cause of a duplicate, and how many
// events it applied (the event and the parked ones it released).
type Result struct {
	Outcome Outcome
	Cause   Cause
	Applied int
}

// record is what the inbox holds of an event received before.
type record struct {
	state               string
	attempt, redelivery int
}

// causeOf names why a delivery of an event came again, from the latest
// hints recorded for it (first's).
func causeOf(first record, d Delivery) Cause {
	switch {
	case first.state == string(Parked):
		return CauseParked
	case d.Redelivery > first.redelivery:
		return CauseRedelivery
	case d.Attempt > first.attempt && first.attempt > 0:
		return CauseRetry
	}
	return CauseUnknown
}

// deliver runs a delivery's one transaction: lock the account, look the
// event up, then count it as a duplicate, park it, or apply it and release
// what it unblocks.
func (r *Receiver) deliver(ctx context.Context, d Delivery) (Result, error) {
	tx, err := r.cfg.DB.Begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	e := d.Event
	// The account's row is the lock that orders its deliveries: two
	// deliveries of one event, or of one account, take it in turn, and the
	// second sees what the first committed.
	var next int64
	err = tx.QueryRow(ctx, `
		INSERT INTO receiver_accounts AS a (account) VALUES ($1)
		ON CONFLICT (account) DO UPDATE SET updated_at = a.updated_at
		RETURNING next_sequence`, e.Account).Scan(&next)
	if err != nil {
		return Result{}, fmt.Errorf("lock account %s: %w", e.Account, err)
	}
	res, err := r.classify(ctx, tx, d, next)
	if err != nil {
		return Result{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf("commit: %w", err)
	}
	return res, nil
}

// classify decides the delivery under its account's lock, and writes it.
func (r *Receiver) classify(ctx context.Context, tx pgx.Tx, d Delivery, next int64) (Result, error) {
	e := d.Event
	var first record
	err := tx.QueryRow(ctx, `SELECT state, attempt, redelivery FROM receiver_events WHERE event_id = $1`, e.ID).
		Scan(&first.state, &first.attempt, &first.redelivery)
	switch {
	case err == nil:
		return duplicate(ctx, tx, d, causeOf(first, d))
	case !errors.Is(err, pgx.ErrNoRows):
		return Result{}, fmt.Errorf("look up event %s: %w", e.ID, err)
	case e.Sequence < next:
		return duplicate(ctx, tx, d, CauseStale)
	case e.Sequence > next:
		_, err := tx.Exec(ctx, `
			INSERT INTO receiver_events (event_id, account, sequence, type, state, attempt, redelivery, body)
			VALUES ($1, $2, $3, $4, 'parked', $5, $6, $7)`, e.ID, e.Account, e.Sequence, e.Type, d.Attempt, d.Redelivery, d.Body)
		if err != nil {
			return Result{}, fmt.Errorf("park event %s: %w", e.ID, err)
		}
		return Result{Outcome: Parked}, nil
	}
	n, err := r.applyFrom(ctx, tx, d)
	if err != nil {
		return Result{}, err
	}
	return Result{Outcome: Applied, Applied: n}, nil
}

// duplicate records a duplicate and its cause, and keeps the latest hints
// on the event's record (so that a retry of a redelivery is a retry);
// nothing is applied.
func duplicate(ctx context.Context, tx pgx.Tx, d Delivery, cause Cause) (Result, error) {
	_, err := tx.Exec(ctx, `
		WITH dup AS (INSERT INTO receiver_duplicates (event_id, cause, attempt) VALUES ($1, $2, $3))
		UPDATE receiver_events SET attempt = greatest(attempt, $3), redelivery = greatest(redelivery, $4) WHERE event_id = $1`,
		d.Event.ID, cause, d.Attempt, d.Redelivery)
	if err != nil {
		return Result{}, fmt.Errorf("record duplicate %s: %w", d.Event.ID, err)
	}
	return Result{Outcome: Duplicate, Cause: cause}, nil
}

// applyFrom applies the event, the account's next, then each parked event
// that follows it without a gap, and moves the account's next sequence
// past them. It returns how many it applied.
func (r *Receiver) applyFrom(ctx context.Context, tx pgx.Tx, d Delivery) (int, error) {
	e := d.Event
	if err := r.apply(ctx, tx, e, `
		INSERT INTO receiver_events (event_id, account, sequence, type, state, attempt, redelivery, applied_at)
		VALUES ($1, $2, $3, $4, 'applied', $5, $6, now())`, e.ID, e.Account, e.Sequence, e.Type, d.Attempt, d.Redelivery); err != nil {
		return 0, err
	}
	rows, _ := tx.Query(ctx, `
		SELECT sequence, body FROM receiver_events WHERE account = $1 AND state = 'parked' AND sequence > $2
		ORDER BY sequence`, e.Account, e.Sequence)
	parked, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Sequence int64
		Body     []byte
	}])
	if err != nil {
		return 0, fmt.Errorf("read parked events of %s: %w", e.Account, err)
	}
	n, next := 1, e.Sequence+1
	for _, p := range parked {
		if p.Sequence != next {
			break // a gap: the rest wait for it
		}
		var pe Event
		if err := json.Unmarshal(p.Body, &pe); err != nil {
			return 0, fmt.Errorf("parked event %s.%d: %w", e.Account, p.Sequence, err)
		}
		if err := r.apply(ctx, tx, pe, `
			UPDATE receiver_events SET state = 'applied', applied_at = now(), body = NULL WHERE event_id = $1`, pe.ID); err != nil {
			return 0, err
		}
		n, next = n+1, next+1
	}
	if _, err := tx.Exec(ctx, `UPDATE receiver_accounts SET next_sequence = $2, updated_at = now() WHERE account = $1`, e.Account, next); err != nil {
		return 0, fmt.Errorf("move account %s to %d: %w", e.Account, next, err)
	}
	return n, nil
}

// apply applies one event's effect and records it applied (with the
// statement given), in the delivery's transaction.
func (r *Receiver) apply(ctx context.Context, tx pgx.Tx, e Event, recordSQL string, args ...any) error {
	if err := r.cfg.Effects.Apply(ctx, tx, e); err != nil {
		return fmt.Errorf("apply event %s: %w", e.ID, err)
	}
	if _, err := tx.Exec(ctx, recordSQL, args...); err != nil {
		return fmt.Errorf("record event %s: %w", e.ID, err)
	}
	return nil
}
