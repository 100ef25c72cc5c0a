package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// PutClient creates or updates a client with the hash of its API key
// (api.HashKey); a RatePerSec of zero means 100. It returns an error for an
// invalid client ID or a negative overdraft, and when the database fails.
func (s *Store) PutClient(ctx context.Context, c api.RegisteredClient, apiKey string) error {
	if c.RatePerSec <= 0 {
		c.RatePerSec = 100
	}
	if err := ledger.ValidClientID(c.ID); err != nil {
		return err
	}
	if c.MaxOverdraft < 0 {
		return fmt.Errorf("put client: max overdraft %d is negative", c.MaxOverdraft)
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO clients (id, name, key_hash, rate_per_sec, max_overdraft) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, key_hash = excluded.key_hash, rate_per_sec = excluded.rate_per_sec,
		    max_overdraft = excluded.max_overdraft`,
		c.ID, c.Name, api.HashKey(apiKey), c.RatePerSec, c.MaxOverdraft)
	if err != nil {
		return fmt.Errorf("put client: %w", err)
	}
	return nil
}

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
	err := s.pool.QueryRow(ctx, `SELECT id, name, rate_per_sec, max_overdraft FROM clients WHERE `+where, arg).
		Scan(&c.ID, &c.Name, &c.RatePerSec, &c.MaxOverdraft)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.RegisteredClient{}, false, nil
	}
	if err != nil {
		return api.RegisteredClient{}, false, fmt.Errorf("read client: %w", err)
	}
	return c, true, nil
}
