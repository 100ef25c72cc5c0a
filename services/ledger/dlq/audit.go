package dlq

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/platform/subjects"
)

// locked runs f holding dead letter seq's advisory lock on a connection of
// its own, so operations on one dead letter from two terminals take turns.
func (o *Ops) locked(ctx context.Context, seq uint64, f func(*pgx.Conn) error) error {
	c, err := o.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("dlq: connect: %w", err)
	}
	defer c.Release()
	key := subjects.DLQStream(o.Region) + "/" + fmt.Sprint(seq)
	if _, err := c.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
		return fmt.Errorf("dlq: lock %s: %w", key, err)
	}
	defer c.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key)
	return f(c.Conn())
}

// audit records an operation on dead letter l.
func audit(ctx context.Context, conn *pgx.Conn, seq uint64, action, operator, why string, l Letter, out Outcome) error {
	_, err := conn.Exec(ctx, `
		INSERT INTO dlq_audit (dlq_seq, action, operator, why, msg_key, dlq_reason, outcome)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT DO NOTHING`, int64(seq), action, operator, why, l.Key(), l.Reason, out.String())
	if err != nil {
		return fmt.Errorf("dlq: audit %s of %d: %w", action, seq, err)
	}
	return nil
}

// lastAction answers for a dead letter that is gone with the last recorded
// operation on it, or ErrNotFound.
func (o *Ops) lastAction(ctx context.Context, conn *pgx.Conn, seq uint64) (Outcome, error) {
	out := Outcome{Seq: seq}
	var action string
	err := conn.QueryRow(ctx, `
		SELECT action, operator, why, msg_key, dlq_reason, at FROM dlq_audit
		WHERE dlq_seq = $1 ORDER BY (action = 'discard') DESC, id DESC LIMIT 1`, int64(seq)).
		Scan(&action, &out.Operator, &out.Why, &out.Key, &out.Reason, &out.At)
	if errors.Is(err, pgx.ErrNoRows) {
		return Outcome{}, fmt.Errorf("%w: %s has no sequence %d and no operator touched it", ErrNotFound, subjects.DLQStream(o.Region), seq)
	}
	if err != nil {
		return Outcome{}, fmt.Errorf("dlq: read audit of %d: %w", seq, err)
	}
	out.Kind = Replayed
	if action == "discard" {
		out.Kind = Discarded
	}
	return out, nil
}

// Discard deletes dead letter seq after recording who discarded it, when
// and why. Discarding a dead letter already discarded returns the first
// record. It returns an error without an operator or a reason, and
// ErrNotFound for a sequence nobody knows.
func (o *Ops) Discard(ctx context.Context, seq uint64, operator, why string) (Outcome, error) {
	switch {
	case operator == "":
		return Outcome{}, errors.New("dlq: discard needs an operator")
	case why == "":
		return Outcome{}, errors.New("dlq: discard needs a reason (why)")
	}
	var out Outcome
	err := o.locked(ctx, seq, func(conn *pgx.Conn) error {
		l, err := o.get(ctx, seq)
		if errors.Is(err, ErrNotFound) {
			out, err = o.lastAction(ctx, conn, seq)
			return err
		}
		if err != nil {
			return err
		}
		if err := audit(ctx, conn, seq, "discard", operator, why, l, Outcome{Seq: seq, Key: l.Key(), Kind: Discarded}); err != nil {
			return err
		}
		if err := o.deleteLetter(ctx, seq); err != nil {
			return err
		}
		out, err = o.lastAction(ctx, conn, seq)
		return err
	})
	return out, err
}
