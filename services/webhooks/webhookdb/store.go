// Package webhookdb keeps a region's webhook endpoints and deliveries in the
// region's database (migration set Migrations), next to the events table
// it queues deliveries from (services/ledger/postgres).
//
// The endpoints: the home region creates and changes an endpoint, each
// change a new version; every region holds a copy, replaced only by a
// higher version (Put), so copies pushed late or twice, in any order, end
// at the latest. The deliveries: Enqueue queues, for every enabled
// endpoint, the events of its client after the endpoint's position up to
// the feed's horizon, in one statement, and moves the position; Claim
// leases the head delivery of each of an endpoint's accounts (an account's
// events go out in sequence order); Finish records a batch's attempts and
// ends, or schedules again, each delivery, in one statement.
package webhookdb

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/webhooks"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations returns the webhooks' migration set. It reads the ledger's
// events table, so it is applied after the ledger's.
func Migrations() pgdb.Migration {
	sub, _ := fs.Sub(migrations, "migrations") // cannot fail: the path is embedded
	return pgdb.Migration{FS: sub, Table: "webhooks_schema_version"}
}

// Store is a region's webhook state.
type Store struct {
	pool   *pgxpool.Pool
	events *postgres.Store // records an endpoint's disabling (nil: not recorded)
}

// New returns the store over a region's database.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// RecordingEvents has the store record, through the region's ledger, the
// webhook_endpoint.disabled event of an endpoint that its home region
// writes disabled (Change), in the transaction that writes it; it returns
// the store.
func (s *Store) RecordingEvents(l *postgres.Store) *Store {
	s.events = l
	return s
}

const endpointColumns = `id, client_id, url, types, secret, coalesce(previous_secret, ''), previous_until, status,
	coalesce(disabled_reason, ''), version, created_at, updated_at`

func scanEndpoint(row pgx.CollectableRow) (webhooks.Endpoint, error) {
	var (
		e     webhooks.Endpoint
		types []string
		until *time.Time
	)
	err := row.Scan(&e.ID, &e.Client, &e.URL, &types, &e.Secret, &e.PreviousSecret, &until, &e.Status, &e.DisabledReason,
		&e.Version, &e.CreatedAt, &e.UpdatedAt)
	for _, t := range types {
		e.Types = append(e.Types, ledger.EventType(t))
	}
	if until != nil {
		e.PreviousUntil = *until
	}
	return e, err
}

func typeNames(types []ledger.EventType) []string {
	out := make([]string, 0, len(types))
	for _, t := range types {
		out = append(out, string(t))
	}
	return out
}

// ErrTooMany is Create's refusal of a client's endpoint past
// webhooks.MaxEndpoints.
var ErrTooMany = ledger.Errorf(ledger.CodeInvalidRequest, "a client has at most %d webhook endpoints: delete one first", webhooks.MaxEndpoints)

// ErrKeyReused is Create's refusal of an Idempotency-Key that created an
// endpoint for another request.
var ErrKeyReused = ledger.Errorf(ledger.CodeIdempotencyKeyReused, "the Idempotency-Key created a webhook endpoint for another request")

// Create records a new endpoint at its home region (version 1), or, under
// an idempotency key (key, the request's hash), returns the one the key
// created for the same request (created false). Creates of one client take
// turns, so the count of its endpoints holds.
func (s *Store) Create(ctx context.Context, e webhooks.Endpoint, key string, hash []byte) (webhooks.Endpoint, bool, error) {
	var (
		out     webhooks.Endpoint
		created bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('webhook_endpoints/' || $1, 0))`, e.Client); err != nil {
			return err
		}
		if key != "" {
			var (
				id  string
				was []byte
			)
			err := tx.QueryRow(ctx, `SELECT id, request_hash FROM webhook_endpoints WHERE client_id = $1 AND idempotency_key = $2`,
				e.Client, key).Scan(&id, &was)
			switch {
			case err == nil && string(was) != string(hash):
				return ErrKeyReused
			case err == nil:
				out, err = s.endpointTx(ctx, tx, id)
				return err
			case !errors.Is(err, pgx.ErrNoRows):
				return err
			}
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE client_id = $1 AND status <> 'deleted'`, e.Client).Scan(&n); err != nil {
			return err
		}
		if n >= webhooks.MaxEndpoints {
			return ErrTooMany
		}
		e.Version, e.Status = 1, webhooks.Enabled
		if err := putTx(ctx, tx, e, key, hash); err != nil {
			return err
		}
		created = true
		var err error
		out, err = s.endpointTx(ctx, tx, e.ID)
		return err
	})
	if err != nil {
		var le *ledger.Error
		if errors.As(err, &le) {
			return out, false, err
		}
		return out, false, fmt.Errorf("create webhook endpoint: %w", err)
	}
	return out, created, nil
}

// putSQL writes an endpoint's version unless the row holds it or a later
// one. A first copy starts its feed at the client's first event created at
// or after the endpoint (or at the feed's horizon, the oldest transaction
// of this database still running, when that is older), so the events since the endpoint was created are queued
// in every region, however late the copy arrives. A row this region does
// not push (a copy: $15) is marked pushed.
const putSQL = `
	INSERT INTO webhook_endpoints AS w (id, client_id, url, types, secret, previous_secret, previous_until, status, disabled_reason,
	                                    version, created_at, updated_at, idempotency_key, request_hash, pushed_version, feed_tx)
	VALUES ($1, $2::text, $3, $4, $5, nullif($6::text, ''), $7, $8, nullif($9::text, ''), $10::bigint, $11::timestamptz, $12,
	        nullif($13::text, ''), $14, CASE WHEN $15::bool THEN $10::bigint ELSE 0 END,
	        least((SELECT horizon FROM (` + postgres.FeedHorizonSQL + `) h),
	              (SELECT min(tx) FROM events WHERE created_at >= $11::timestamptz AND client_id = $2::text)))
	ON CONFLICT (id) DO UPDATE SET url = excluded.url, types = excluded.types, secret = excluded.secret,
	    previous_secret = excluded.previous_secret, previous_until = excluded.previous_until, status = excluded.status,
	    disabled_reason = excluded.disabled_reason, version = excluded.version, updated_at = excluded.updated_at,
	    pushed_version = CASE WHEN $15::bool THEN excluded.version ELSE w.pushed_version END
	WHERE w.version < excluded.version AND w.client_id = excluded.client_id`

func putTx(ctx context.Context, tx pgx.Tx, e webhooks.Endpoint, key string, hash []byte) error {
	_, err := tx.Exec(ctx, putSQL, putArgs(e, key, hash, false)...)
	return err
}

func putArgs(e webhooks.Endpoint, key string, hash []byte, copied bool) []any {
	var until *time.Time
	if !e.PreviousUntil.IsZero() {
		until = &e.PreviousUntil
	}
	return []any{e.ID, e.Client, e.URL, typeNames(e.Types), e.Secret, e.PreviousSecret, until, string(e.Status), e.DisabledReason,
		e.Version, e.CreatedAt, e.UpdatedAt, key, hash, copied}
}

// Put writes a copy of an endpoint homed in another region, unless this
// region holds that version or a later one (applied false). A copy whose
// client differs from the row's is never applied.
func (s *Store) Put(ctx context.Context, e webhooks.Endpoint) (bool, error) {
	tag, err := s.pool.Exec(ctx, putSQL, putArgs(e, "", nil, true)...)
	if err != nil {
		return false, fmt.Errorf("put webhook endpoint %s: %w", e.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

func (s *Store) endpointTx(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, id string) (webhooks.Endpoint, error) {
	rows, _ := q.Query(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints WHERE id = $1`, id)
	return pgx.CollectExactlyOneRow(rows, scanEndpoint)
}

// Endpoint returns an endpoint as this region holds it, deleted ones too,
// or false.
func (s *Store) Endpoint(ctx context.Context, id string) (webhooks.Endpoint, bool, error) {
	e, err := s.endpointTx(ctx, s.pool, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return e, false, nil
	case err != nil:
		return e, false, fmt.Errorf("read webhook endpoint %s: %w", id, err)
	}
	return e, true, nil
}

// Endpoints returns a client's endpoints that are not deleted, newest
// first.
func (s *Store) Endpoints(ctx context.Context, client string) ([]webhooks.Endpoint, error) {
	rows, _ := s.pool.Query(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints
		WHERE client_id = $1 AND status <> 'deleted' ORDER BY created_at DESC, id DESC`, client)
	out, err := pgx.CollectRows(rows, scanEndpoint)
	if err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	return out, nil
}

// Change changes an endpoint at its home region: it locks the row, lets
// change edit it (an error aborts), and writes it as the next version. A
// deleted endpoint is not found.
func (s *Store) Change(ctx context.Context, id, client string, change func(*webhooks.Endpoint) error) (webhooks.Endpoint, bool, error) {
	var (
		out   webhooks.Endpoint
		found bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints
			WHERE id = $1 AND client_id = $2 AND status <> 'deleted' FOR UPDATE`, id, client)
		e, err := pgx.CollectExactlyOneRow(rows, scanEndpoint)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		if err := change(&e); err != nil {
			return err
		}
		e.Version++
		if _, err := tx.Exec(ctx, putSQL, putArgs(e, "", nil, false)...); err != nil {
			return err
		}
		if e.Status == webhooks.Deleted {
			if err := endPending(ctx, tx, e.ID, "the endpoint was deleted"); err != nil {
				return err
			}
		}
		// Disabled here by this region's worker (Disable) or by another
		// region's word: the home records the event once, either way.
		if e.Status == webhooks.Disabled && s.events != nil {
			if err := s.events.RecordEndpointDisabled(ctx, tx, e.ID, e.Client, e.DisabledReason); err != nil {
				return err
			}
		}
		out = e
		return nil
	})
	if err != nil {
		var le *ledger.Error
		if errors.As(err, &le) {
			return out, found, err
		}
		return out, found, fmt.Errorf("change webhook endpoint %s: %w", id, err)
	}
	return out, found, nil
}

// Unpushed returns up to limit endpoints this region writes whose latest
// version not every region has acknowledged.
func (s *Store) Unpushed(ctx context.Context, limit int) ([]webhooks.Endpoint, error) {
	rows, _ := s.pool.Query(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints
		WHERE pushed_version < version ORDER BY updated_at LIMIT $1`, limit)
	out, err := pgx.CollectRows(rows, scanEndpoint)
	if err != nil {
		return nil, fmt.Errorf("unpushed webhook endpoints: %w", err)
	}
	return out, nil
}

// Pushed records that every region holds version of an endpoint.
func (s *Store) Pushed(ctx context.Context, id string, version int64) error {
	if _, err := s.pool.Exec(ctx, `UPDATE webhook_endpoints SET pushed_version = $2 WHERE id = $1 AND pushed_version < $2`, id, version); err != nil {
		return fmt.Errorf("webhook endpoint %s pushed: %w", id, err)
	}
	return nil
}

// Disable disables this region's copy of an endpoint whose deliveries
// failed for good, and fails its pending deliveries, unless it is deleted
// or disabled already (false). The version stays: the home region, told
// of it, writes the disabled endpoint as its next version.
func (s *Store) Disable(ctx context.Context, id, reason string) (bool, error) {
	var changed bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = $2, updated_at = now()
			WHERE id = $1 AND status = 'enabled'`, id, reason)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		changed = true
		return endPending(ctx, tx, id, "the endpoint was disabled: "+reason)
	})
	if err != nil {
		return false, fmt.Errorf("disable webhook endpoint %s: %w", id, err)
	}
	return changed, nil
}

func endPending(ctx context.Context, tx pgx.Tx, id, why string) error {
	_, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET status = 'failed', ended_at = now(), leased_until = NULL,
		last_error = coalesce(last_error || '; ', '') || $2 WHERE endpoint_id = $1 AND status = 'pending'`, id, why)
	return err
}
