package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// IdempotencyKey is the stored state of one client's idempotency key.
type IdempotencyKey struct {
	ClientID, Key string
	Fingerprint   []byte
	TransferID    string
	InFlight      bool
	LeaseUntil    time.Time
	// Status and Body are the stored response, once there is one; Final
	// means it will not change any more.
	Status    int
	Body      []byte
	Final     bool
	CreatedAt time.Time
	ExpiresAt time.Time
}

// KeyOutcome is what BeginKey found.
type KeyOutcome int

// Outcomes of BeginKey.
const (
	// KeyNew: the key was free (or expired); the caller owns it now.
	KeyNew KeyOutcome = iota + 1
	// KeyTakenOver: the key was in flight under an expired lease (its
	// holder died); the caller owns it now and must submit the same
	// transfer again.
	KeyTakenOver
	// KeyReplay: the key has a stored response; return it.
	KeyReplay
	// KeyInFlight: another request holds the key right now.
	KeyInFlight
	// KeyMismatch: the key was used with a different request body.
	KeyMismatch
)

const keyColumns = `client_id, key, fingerprint, transfer_id, state = 'in_flight', lease_until,
	coalesce(response_status, 0), coalesce(response_body, ''), response_final, created_at, expires_at`

func scanKey(row pgx.CollectableRow) (IdempotencyKey, error) {
	var k IdempotencyKey
	err := row.Scan(&k.ClientID, &k.Key, &k.Fingerprint, &k.TransferID, &k.InFlight, &k.LeaseUntil,
		&k.Status, &k.Body, &k.Final, &k.CreatedAt, &k.ExpiresAt)
	return k, err
}

// BeginKey claims an idempotency key for a request with the given
// fingerprint and says what to do. A new or expired key is taken with a
// lease and newTransferID; an in-flight key whose lease expired is taken
// over (its transfer ID is kept, so a repeat submission is deduplicated by
// the ledger). A key never seen, the common case, costs one statement;
// any other goes to ResolveKey. It returns an error only when the database
// fails.
func (s *Store) BeginKey(ctx context.Context, client, key string, fp []byte, newTransferID string, now time.Time, lease, ttl time.Duration) (IdempotencyKey, KeyOutcome, error) {
	rows, err := s.pool.Query(ctx, insertKeySQL+` ON CONFLICT (client_id, key) DO NOTHING RETURNING `+keyColumns,
		client, key, fp, newTransferID, now.Add(lease), now, now.Add(ttl))
	if err == nil {
		var k IdempotencyKey
		if k, err = pgx.CollectExactlyOneRow(rows, scanKey); err == nil {
			return k, KeyNew, nil
		}
	}
	// The key exists, or the insert's outcome is unknown.
	return s.ResolveKey(ctx, client, key, fp, newTransferID, now, lease, ttl)
}

// ResolveKey is BeginKey without its first insert: a transaction that
// locks the key's row and says what to do with it, claiming it when it is
// missing or expired. It finds this call's own claim (an insert whose
// answer was lost) by its transfer ID.
func (s *Store) ResolveKey(ctx context.Context, client, key string, fp []byte, newTransferID string, now time.Time, lease, ttl time.Duration) (IdempotencyKey, KeyOutcome, error) {
	var k IdempotencyKey
	var out KeyOutcome
	err := s.transact(ctx, "begin idempotency key", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+keyColumns+` FROM idempotency_keys WHERE client_id = $1 AND key = $2 FOR UPDATE`, client, key)
		if err != nil {
			return err
		}
		k, err = pgx.CollectExactlyOneRow(rows, scanKey)
		found := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		switch {
		case found && k.InFlight && k.TransferID == newTransferID:
			// This call's own claim, made by an attempt whose answer was
			// lost: transfer IDs are never reused.
			out = KeyNew
			return nil
		case found && k.ExpiresAt.Before(now):
			if _, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE client_id = $1 AND key = $2`, client, key); err != nil {
				return err
			}
		case found && !bytes.Equal(k.Fingerprint, fp) && !s.cfg.Bugs.IgnoreKeyBody: // deliberate bug, tests only
			out = KeyMismatch
			return nil
		case found && !k.InFlight:
			out = KeyReplay
			return nil
		case found && k.LeaseUntil.After(now):
			out = KeyInFlight
			return nil
		case found:
			rows, err := tx.Query(ctx, `UPDATE idempotency_keys SET lease_until = $3 WHERE client_id = $1 AND key = $2 RETURNING `+keyColumns,
				client, key, now.Add(lease))
			if err != nil {
				return err
			}
			k, err = pgx.CollectExactlyOneRow(rows, scanKey)
			out = KeyTakenOver
			return err
		}
		rows, err = tx.Query(ctx, insertKeySQL+` RETURNING `+keyColumns,
			client, key, fp, newTransferID, now.Add(lease), now, now.Add(ttl))
		if err != nil {
			return err
		}
		k, err = pgx.CollectExactlyOneRow(rows, scanKey)
		out = KeyNew
		return err
	}, func(ctx context.Context) (bool, error) {
		// The COMMIT went unanswered. A new key committed if its row names
		// this call's transfer ID; otherwise the retry sees what is there
		// (after a take-over that did commit: its own lease, a 409).
		if out != KeyNew {
			return false, nil
		}
		cur, ok, err := s.Key(ctx, client, key)
		return ok && cur.TransferID == newTransferID, err
	})
	return k, out, err
}

// KeyStart is what StartKey found.
type KeyStart struct {
	// Source is the request's source account; SourceFound is false when
	// it does not exist.
	Source      ledger.Account
	SourceFound bool
	// Claimed is set when the key was new and is now claimed (Key); when
	// it is not, and the source is the client's, the key exists: BeginKey
	// says what to do with it.
	Claimed bool
	Key     IdempotencyKey
	// Prior is the transfer the client's key already made (its business
	// key outlives the idempotency key); zero when there is none.
	Prior ledger.Transfer
}

// StartKey is the first step of a transfer request, in one round trip: it
// reads the source account, claims the key as new (as BeginKey would) only
// if the account is a customer account of the client (or ownerOnly is
// false), and reads the transfer the client's key already made.
func (s *Store) StartKey(ctx context.Context, client, key string, fp []byte, newTransferID, source string, ownerOnly bool, now time.Time, lease, ttl time.Duration) (KeyStart, error) {
	var st KeyStart
	b := &pgx.Batch{}
	b.Queue(`SELECT `+accountColumns+` FROM accounts WHERE id = $1`, source).Query(func(rows pgx.Rows) error {
		a, err := pgx.CollectExactlyOneRow(rows, scanAccount)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		st.Source, st.SourceFound = a, err == nil
		return err
	})
	b.Queue(insertKeySQL+`
		WHERE NOT $8 OR EXISTS (SELECT 1 FROM accounts WHERE id = $9 AND client_id = $1 AND kind = 'customer')
		ON CONFLICT (client_id, key) DO NOTHING RETURNING `+keyColumns,
		client, key, fp, newTransferID, now.Add(lease), now, now.Add(ttl), ownerOnly, source).Query(func(rows pgx.Rows) error {
		k, err := pgx.CollectExactlyOneRow(rows, scanKey)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		st.Key, st.Claimed = k, err == nil
		return err
	})
	if !s.cfg.Bugs.ForgetKeyTransfer { // deliberate bug, tests only: see TransferByKey
		b.Queue(transferByKeySQL, client, key).Query(func(rows pgx.Rows) error {
			t, err := pgx.CollectExactlyOneRow(rows, scanTransfer)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			st.Prior = t
			return err
		})
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return KeyStart{}, fmt.Errorf("start idempotency key: %w", err)
	}
	return st, nil
}

// AnsweredKeys returns, of the keys clients[i]/keys[i], those that are
// answered (no longer in flight).
func (s *Store) AnsweredKeys(ctx context.Context, clients, keys []string) ([]IdempotencyKey, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT `+keyColumns+` FROM idempotency_keys
		WHERE (client_id, key) IN (SELECT * FROM unnest($1::text[], $2::text[])) AND state = 'done'`, clients, keys)
	if err != nil {
		return nil, fmt.Errorf("read idempotency keys: %w", err)
	}
	ks, err := pgx.CollectRows(rows, scanKey)
	if err != nil {
		return nil, fmt.Errorf("read idempotency keys: %w", err)
	}
	return ks, nil
}

// insertKeySQL claims a new key, in flight with a lease (a SELECT, so that
// StartKey can make it conditional).
const insertKeySQL = `
	INSERT INTO idempotency_keys (client_id, key, fingerprint, transfer_id, state, lease_until, created_at, expires_at)
	SELECT $1, $2, $3, $4, 'in_flight', $5::timestamptz, $6::timestamptz, $7::timestamptz`

// Key reads an idempotency key; false when there is none.
func (s *Store) Key(ctx context.Context, client, key string) (IdempotencyKey, bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+` FROM idempotency_keys WHERE client_id = $1 AND key = $2`, client, key)
	if err != nil {
		return IdempotencyKey{}, false, fmt.Errorf("read idempotency key: %w", err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return IdempotencyKey{}, false, nil
	}
	if err != nil {
		return IdempotencyKey{}, false, fmt.Errorf("read idempotency key: %w", err)
	}
	return k, true, nil
}

// Answer stores the response the caller is about to send, unless one is
// already stored, and returns the key as stored: send what it holds. With
// replace set, a stored response that is not final yet (the ledger's
// provisional 202 of a cross-region transfer) is replaced. Either way the
// stored response becomes final.
func (s *Store) Answer(ctx context.Context, client, key string, status int, body []byte, replace bool) (IdempotencyKey, error) {
	rows, err := s.pool.Query(ctx, `
		UPDATE idempotency_keys SET state = 'done', response_final = true,
		       response_status = CASE WHEN state = 'in_flight' OR ($5 AND NOT response_final) THEN $3 ELSE response_status END,
		       response_body   = CASE WHEN state = 'in_flight' OR ($5 AND NOT response_final) THEN $4 ELSE response_body END
		WHERE client_id = $1 AND key = $2
		RETURNING `+keyColumns, client, key, status, body, replace)
	if err != nil {
		return IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanKey)
	if err != nil {
		return IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	return k, nil
}

// DeleteExpiredKeys removes idempotency keys whose retention ended before
// now, and returns how many.
func (s *Store) DeleteExpiredKeys(ctx context.Context, now time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE expires_at < $1`, now)
	if err != nil {
		return 0, fmt.Errorf("delete expired idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// queueResponses queues, in the apply transaction's batch, the first
// response to every client request whose idempotency key is still in
// flight: the response is durable in the same transaction as the debit.
// It is final (the API stores nothing after it) unless it is a 202, which
// the API replaces with the transfer's final state if it sees it in time.
func (s *Store) queueResponses(b *pgx.Batch, cmds []ledger.Command, results []ledger.Result) {
	if s.cfg.Respond == nil {
		return
	}
	var clients, keys []string
	var statuses []int32
	var bodies [][]byte
	for i, c := range cmds {
		r := results[i]
		if c.IsStep() || r.Kind == ledger.InProgress || r.Kind == ledger.Parked || (r.Kind == ledger.Duplicate && r.Transfer.ID == "") {
			continue
		}
		status, body := s.cfg.Respond(r)
		clients, keys = append(clients, c.ClientID), append(keys, c.IdempotencyKey)
		statuses, bodies = append(statuses, int32(status)), append(bodies, body)
	}
	if len(clients) == 0 {
		return
	}
	b.Queue(`
		UPDATE idempotency_keys k SET state = 'done', response_status = u.status, response_body = u.body,
		       response_final = u.status <> 202
		FROM unnest($1::text[], $2::text[], $3::int[], $4::bytea[]) AS u(client_id, key, status, body)
		WHERE k.client_id = u.client_id AND k.key = u.key AND k.state = 'in_flight'`,
		clients, keys, statuses, bodies)
}
