package apidb

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// PutClient creates or updates a client or operator, with apiKey (kept as
// api.HashKey) as its only key; a RatePerSec of zero means 100 and an empty Role
// api.RoleClient. An id keeps the role it was created with. It returns an
// error for an invalid ID, an unknown role, a negative overdraft or an
// operator's overdraft, ErrRoleTaken for an id registered in the other
// role, and an error when the database fails.
func (s *Store) PutClient(ctx context.Context, c api.RegisteredClient, apiKey string) error {
	if c.RatePerSec <= 0 {
		c.RatePerSec = 100
	}
	if err := ledger.ValidClientID(c.ID); err != nil {
		return err
	}
	role := c.RoleOf()
	switch {
	case role != api.RoleClient && role != api.RoleOperator:
		return fmt.Errorf("put client: unknown role %q", c.Role)
	case c.MaxOverdraft < 0:
		return fmt.Errorf("put client: max overdraft %d is negative", c.MaxOverdraft)
	case role == api.RoleOperator && c.MaxOverdraft != 0:
		return fmt.Errorf("put client: operator %s cannot have an overdraft: operators move no money", c.ID)
	}
	hash := api.HashKey(apiKey)
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			INSERT INTO clients (id, name, rate_per_sec, max_overdraft, role) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (id) DO UPDATE SET name = excluded.name, rate_per_sec = excluded.rate_per_sec,
			    max_overdraft = excluded.max_overdraft
			WHERE clients.role = excluded.role`,
			c.ID, c.Name, c.RatePerSec, c.MaxOverdraft, string(role))
		if err != nil {
			return fmt.Errorf("put client: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("put client: %w: %s is not registered as %s", ErrRoleTaken, c.ID, role)
		}
		// Registering again replaces every key the client had.
		if _, err := tx.Exec(ctx, `DELETE FROM api_keys WHERE client_id = $1`, c.ID); err != nil {
			return fmt.Errorf("put client: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO api_keys (key_hash, client_id, key_id) VALUES ($1, $2, $3)`, hash, c.ID, keyID(hash)); err != nil {
			return fmt.Errorf("put client: %w", err)
		}
		return nil
	})
}

// keyID names a key by the first 8 hex digits of its hash.
func keyID(hash []byte) string { return hex.EncodeToString(hash[:4]) }

// AddKey gives client another API key, valid at once and until expires
// (zero: no expiry), beside the keys it has: a rotation's first half. It
// returns the key's description, ErrNoClient for an unknown client, and an
// error for an expiry that has passed or when the database fails.
func (s *Store) AddKey(ctx context.Context, client, apiKey string, expires time.Time) (api.KeyInfo, error) {
	if !expires.IsZero() && !expires.After(time.Now()) {
		return api.KeyInfo{}, fmt.Errorf("add key: expiry %s has passed", expires.Format(time.RFC3339))
	}
	var exp *time.Time
	if !expires.IsZero() {
		exp = &expires
	}
	hash := api.HashKey(apiKey)
	rows, err := s.pool.Query(ctx, `
		INSERT INTO api_keys (key_hash, client_id, key_id, expires_at)
		SELECT $1, id, $3, $4 FROM clients WHERE id = $2
		RETURNING `+apiKeyColumns, hash, client, keyID(hash), exp)
	if err != nil {
		return api.KeyInfo{}, fmt.Errorf("add key: %w", err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanKeyInfo)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.KeyInfo{}, fmt.Errorf("add key: %w: %s", ErrNoClient, client)
	}
	if err != nil {
		return api.KeyInfo{}, fmt.Errorf("add key: %w", err)
	}
	return k, nil
}

// RevokeKey revokes client's key keyID now: from then on it authenticates
// nothing (an API process that cached it accepts it for at most its
// client cache's TTL). Revoking a revoked key changes nothing. It returns
// ErrNoKey when the client has no such key.
func (s *Store) RevokeKey(ctx context.Context, client, keyID string) error {
	tag, err := s.pool.Exec(ctx, `
		UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE client_id = $1 AND key_id = $2`, client, keyID)
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("revoke key: %w: %s has no key %s", ErrNoKey, client, keyID)
	}
	return nil
}

// Keys returns client's keys, oldest first, revoked and expired ones
// included.
func (s *Store) Keys(ctx context.Context, client string) ([]api.KeyInfo, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE client_id = $1 ORDER BY created_at, key_id`, client)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	ks, err := pgx.CollectRows(rows, scanKeyInfo)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return ks, nil
}

// Errors of the key operations.
var (
	// ErrNoClient: the client is not registered in this region.
	ErrNoClient = errors.New("no such client")
	// ErrNoKey: the client has no key of that id.
	ErrNoKey = errors.New("no such key")
)

const apiKeyColumns = `key_id, created_at, expires_at, revoked_at`

func scanKeyInfo(row pgx.CollectableRow) (api.KeyInfo, error) {
	var k api.KeyInfo
	var exp, rev *time.Time
	if err := row.Scan(&k.ID, &k.CreatedAt, &exp, &rev); err != nil {
		return k, err
	}
	if exp != nil {
		k.ExpiresAt = *exp
	}
	if rev != nil {
		k.RevokedAt = *rev
	}
	return k, nil
}

// ErrRoleTaken is returned by PutClient for an id that is registered in
// the other role: a client cannot become an operator, nor the reverse.
var ErrRoleTaken = errors.New("the id belongs to the other role")

// ClientByKey returns the client whose API key hashes to hash, or false:
// a key that is unknown, revoked or expired authenticates nobody.
func (s *Store) ClientByKey(ctx context.Context, hash []byte) (api.RegisteredClient, bool, error) {
	return s.client(ctx, `id = (SELECT client_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL
		AND (expires_at IS NULL OR expires_at > now()))`, hash)
}

// ClientByID returns a client, or false.
func (s *Store) ClientByID(ctx context.Context, id string) (api.RegisteredClient, bool, error) {
	return s.client(ctx, `id = $1`, id)
}

func (s *Store) client(ctx context.Context, where string, arg any) (api.RegisteredClient, bool, error) {
	var c api.RegisteredClient
	err := s.pool.QueryRow(ctx, `SELECT id, name, role, rate_per_sec, max_overdraft FROM clients WHERE `+where, arg).
		Scan(&c.ID, &c.Name, &c.Role, &c.RatePerSec, &c.MaxOverdraft)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.RegisteredClient{}, false, nil
	}
	if err != nil {
		return api.RegisteredClient{}, false, fmt.Errorf("read client: %w", err)
	}
	return c, true, nil
}
