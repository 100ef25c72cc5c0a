package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

const transferColumns = `id, client_id, idempotency_key, fingerprint, from_account, to_account, amount, currency,
	status, coalesce(reason, ''), version, created_at, expires_at, coalesce(captured_amount, 0), coalesce(refund_of, ''),
	refunded_amount, coalesce(reference, ''), metadata`

func scanTransfer(row pgx.CollectableRow) (ledger.Transfer, error) {
	var t ledger.Transfer
	var expires *time.Time
	err := row.Scan(&t.ID, &t.ClientID, &t.IdempotencyKey, &t.Fingerprint, &t.From, &t.To, &t.Amount, &t.Currency,
		&t.Status, &t.Reason, &t.Version, &t.CreatedAt, &expires, &t.CapturedAmount, &t.RefundOf, &t.RefundedAmount,
		&t.Reference, &t.Metadata)
	if expires != nil {
		t.ExpiresAt = *expires
	}
	return t, err
}

// Transfer returns a transfer by ID, or an *ledger.Error with CodeNotFound.
func (s *Store) Transfer(ctx context.Context, id string) (ledger.Transfer, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+transferColumns+` FROM transfers WHERE id = $1`, id)
	if err != nil {
		return ledger.Transfer{}, fmt.Errorf("read transfer: %w", err)
	}
	t, err := pgx.CollectExactlyOneRow(rows, scanTransfer)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Transfer{}, ledger.Errorf(ledger.CodeNotFound, "transfer %s does not exist", id)
	}
	if err != nil {
		return ledger.Transfer{}, fmt.Errorf("read transfer: %w", err)
	}
	return t, nil
}

// Advance moves a transfer along its state machine with a compare-and-set on
// the (status, version) the caller read. It returns an *ledger.Error with
// CodeIllegalTransition when the machine has no such step (a repeated or
// out-of-order event), CodeStaleVersion when the transfer moved on since it
// was read (this also stops ABA: the version never repeats), or
// CodeNotFound. Every refusal is counted in Stats.
func (s *Store) Advance(ctx context.Context, id string, from ledger.Status, version int64, ev ledger.Event) (ledger.Transfer, error) {
	to, err := ledger.Next(from, ev)
	if err != nil {
		s.stats().IllegalTransitions.Add(1)
		return ledger.Transfer{}, err
	}
	rows, err := s.pool.Query(ctx, `
		UPDATE transfers SET status = $4, version = version + 1
		WHERE id = $1 AND status = $2 AND version = $3
		RETURNING `+transferColumns, id, from, version, to)
	if err != nil {
		return ledger.Transfer{}, fmt.Errorf("advance transfer: %w", err)
	}
	t, err := pgx.CollectExactlyOneRow(rows, scanTransfer)
	if err == nil {
		return t, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return ledger.Transfer{}, fmt.Errorf("advance transfer: %w", err)
	}
	cur, err := s.Transfer(ctx, id)
	if err != nil {
		return ledger.Transfer{}, err
	}
	s.stats().StaleVersions.Add(1)
	return cur, ledger.Errorf(ledger.CodeStaleVersion, "transfer %s is %s v%d, not %s v%d", id, cur.Status, cur.Version, from, version)
}

// QueueTransferByKey queues in b the read of the transfer a client's
// idempotency key made (the ledger's business key, which outlives the API's
// idempotency key) into *t, setting *found when there is one: a caller
// composes it with its own statements in one round trip. The batch's Close
// returns the read's error.
func QueueTransferByKey(b *pgx.Batch, client, key string, t *ledger.Transfer, found *bool) {
	b.Queue(`SELECT `+transferColumns+` FROM transfers WHERE client_id = $1 AND idempotency_key = $2`, client, key).Query(func(rows pgx.Rows) error {
		v, err := pgx.CollectExactlyOneRow(rows, scanTransfer)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*t, *found = v, err == nil
		return err
	})
}

// ClientKey is a client's idempotency key, the business key of its
// transfers.
type ClientKey struct{ Client, Key string }

// QueueTransfersByKey queues in b the read of the transfers that the
// clients' keys made (clients[i]'s keys[i]) into out: QueueTransferByKey
// for many, in one statement of one index lookup per key. The batch's Close
// returns the read's error.
func QueueTransfersByKey(b *pgx.Batch, clients, keys []string, out map[ClientKey]ledger.Transfer) {
	b.Queue(`
		SELECT t.* FROM unnest($1::text[], $2::text[]) AS k(client_id, idempotency_key)
		CROSS JOIN LATERAL (
		    SELECT `+transferColumns+` FROM transfers
		    WHERE client_id = k.client_id AND idempotency_key = k.idempotency_key LIMIT 1) t`, clients, keys).Query(func(rows pgx.Rows) error {
		ts, err := pgx.CollectRows(rows, scanTransfer)
		for _, t := range ts {
			out[ClientKey{t.ClientID, t.IdempotencyKey}] = t
		}
		return err
	})
}

// Completion is how long a settled transfer took from its request to its
// final state.
type Completion struct {
	Cross    bool
	To       string // the payee's region
	Duration time.Duration
}

// Completions returns the completion times of the transfers settled here
// (COMPLETED or REFUNDED), split by same-region and cross-region.
func (s *Store) Completions(ctx context.Context) ([]Completion, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT split_part(to_account, '-', 1) <> $1, split_part(to_account, '-', 1), coalesce(settled_at, applied_at) - created_at
		FROM transfers WHERE type = 'transfer' AND status IN ('COMPLETED', 'REFUNDED')`, s.cfg.Region)
	if err != nil {
		return nil, fmt.Errorf("read completions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Completion, error) {
		var c Completion
		err := r.Scan(&c.Cross, &c.To, &c.Duration)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read completions: %w", err)
	}
	return out, nil
}

const creditColumns = `transfer_id, from_account, to_account, amount, currency, status, coalesce(reason, ''), created_at,
	coalesce(refund_of, ''), refunded_amount`

func scanCredit(row pgx.CollectableRow) (ledger.Credit, error) {
	var c ledger.Credit
	err := row.Scan(&c.TransferID, &c.From, &c.To, &c.Amount, &c.Currency, &c.Status, &c.Reason, &c.CreatedAt, &c.RefundOf, &c.RefundedAmount)
	return c, err
}

// here reports whether the transfer id was made in this store's region.
func (s *Store) here(id string) bool {
	r, err := s.cfg.Regions.HomeRegion(id)
	return err == nil && r == s.cfg.Region
}

// Refunds returns the refunds of the transfer id that this region knows:
// for a transfer whose payee is here, every refund (each is decided here);
// for one whose payee is in another region, the refunds credited here (a
// refund still on its way is not here yet). The total counts the refunds
// that moved money (not refused).
func (s *Store) Refunds(ctx context.Context, id string) (refunds []ledger.Refund, total int64, err error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, amount, status FROM transfers WHERE refund_of = $1
		UNION ALL
		-- A credited refund reached the payer: COMPLETED here; a refused
		-- one went back to the payee.
		SELECT transfer_id, amount, CASE status WHEN 'CREDITED' THEN 'COMPLETED' ELSE 'REFUNDED' END FROM credits WHERE refund_of = $1
		ORDER BY 1`, id)
	if err != nil {
		return nil, 0, fmt.Errorf("read refunds: %w", err)
	}
	refunds, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledger.Refund, error) {
		var x ledger.Refund
		err := r.Scan(&x.ID, &x.Amount, &x.Status)
		return x, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("read refunds: %w", err)
	}
	for _, x := range refunds {
		switch ledger.Status(x.Status) {
		case ledger.StatusCompleted, ledger.StatusDebited:
			total += x.Amount
		}
	}
	return refunds, total, nil
}

// ActionByKey returns the capture or void a client's idempotency key made
// (its business key), or false.
func (s *Store) ActionByKey(ctx context.Context, client, key string) (ledger.Action, bool, error) {
	var a ledger.Action
	err := s.pool.QueryRow(ctx, `
		SELECT `+actionColumns+` FROM actions WHERE client_id = $1 AND idempotency_key = $2`, client, key).Scan(actionFields(&a)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Action{}, false, nil
	}
	if err != nil {
		return ledger.Action{}, false, fmt.Errorf("read action: %w", err)
	}
	return a, true, nil
}

// actionColumns are the columns of the actions view (transfer_actions and
// account_actions) that make a ledger.Action, scanned by actionFields.
const actionColumns = `client_id, idempotency_key, fingerprint, transfer_id, account_id, type, amount, status, coalesce(reason, ''), created_at`

func actionFields(a *ledger.Action) []any {
	return []any{&a.ClientID, &a.IdempotencyKey, &a.Fingerprint, &a.TransferID, &a.AccountID, &a.Type, &a.Amount, &a.Status, &a.Reason, &a.CreatedAt}
}
