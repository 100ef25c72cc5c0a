package postgres

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// Client is an API client.
type Client struct {
	ID         string
	Name       string
	RatePerSec int
	// MaxOverdraft is the most overdraft the client may give its accounts
	// (their floor is at least -MaxOverdraft).
	MaxOverdraft int64
}

// HashKey is how API keys are stored: their SHA-256. Keys are random and
// long, so a fast hash is enough (no dictionary to attack).
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// PutClient creates or updates a client with the hash of its API key.
func (s *Store) PutClient(ctx context.Context, c Client, apiKey string) error {
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
		c.ID, c.Name, HashKey(apiKey), c.RatePerSec, c.MaxOverdraft)
	if err != nil {
		return fmt.Errorf("put client: %w", err)
	}
	return nil
}

// ClientByKey returns the client whose API key hashes to hash, or false.
func (s *Store) ClientByKey(ctx context.Context, hash []byte) (Client, bool, error) {
	return s.client(ctx, `key_hash = $1`, hash)
}

// ClientByID returns a client, or false.
func (s *Store) ClientByID(ctx context.Context, id string) (Client, bool, error) {
	return s.client(ctx, `id = $1`, id)
}

func (s *Store) client(ctx context.Context, where string, arg any) (Client, bool, error) {
	var c Client
	err := s.pool.QueryRow(ctx, `SELECT id, name, rate_per_sec, max_overdraft FROM clients WHERE `+where, arg).
		Scan(&c.ID, &c.Name, &c.RatePerSec, &c.MaxOverdraft)
	if errors.Is(err, pgx.ErrNoRows) {
		return Client{}, false, nil
	}
	if err != nil {
		return Client{}, false, fmt.Errorf("read client: %w", err)
	}
	return c, true, nil
}

// PostingsPage returns up to limit change-log rows of an account with a
// version above after, in version order.
func (s *Store) PostingsPage(ctx context.Context, accountID string, after int64, limit int) ([]ledger.Posting, error) {
	return s.postings(ctx, `account_id = $1 AND account_version > $2 ORDER BY account_version LIMIT $3`, accountID, after, limit)
}

// TransferPostings returns a transfer's change-log rows in this region.
func (s *Store) TransferPostings(ctx context.Context, transferID string) ([]ledger.Posting, error) {
	return s.postings(ctx, `transfer_id = $1 ORDER BY created_at, leg`, transferID)
}

func (s *Store) postings(ctx context.Context, where string, args ...any) ([]ledger.Posting, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT transfer_id, leg, account_id, amount, balance_after, account_version
		FROM postings WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("read postings: %w", err)
	}
	ps, err := pgx.CollectRows(rows, scanPosting)
	if err != nil {
		return nil, fmt.Errorf("read postings: %w", err)
	}
	return ps, nil
}

func scanPosting(r pgx.CollectableRow) (ledger.Posting, error) {
	var p ledger.Posting
	err := r.Scan(&p.TransferID, &p.Leg, &p.AccountID, &p.Amount, &p.BalanceAfter, &p.AccountVersion)
	return p, err
}
