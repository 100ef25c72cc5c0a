package apidb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// PutClient creates or updates a client or operator with the hash of its
// API key (api.HashKey); a RatePerSec of zero means 100 and an empty Role
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
	tag, err := s.pool.Exec(ctx, `
		INSERT INTO clients (id, name, key_hash, rate_per_sec, max_overdraft, role) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, key_hash = excluded.key_hash, rate_per_sec = excluded.rate_per_sec,
		    max_overdraft = excluded.max_overdraft
		WHERE clients.role = excluded.role`,
		c.ID, c.Name, api.HashKey(apiKey), c.RatePerSec, c.MaxOverdraft, string(role))
	if err != nil {
		return fmt.Errorf("put client: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("put client: %w: %s is not registered as %s", ErrRoleTaken, c.ID, role)
	}
	return nil
}

// ErrRoleTaken is returned by PutClient for an id that is registered in
// the other role: a client cannot become an operator, nor the reverse.
var ErrRoleTaken = errors.New("the id belongs to the other role")

// ClientByKey returns the client whose API key hashes to hash, or false.
func (s *Store) ClientByKey(ctx context.Context, hash []byte) (api.RegisteredClient, bool, error) {
	return s.client(ctx, `key_hash = $1`, hash)
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
