package apidb

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// ClaimAccountKey records that a client's account key opens its account
// in region, unless the key was claimed before, and returns the region
// the first claim chose. Claims with one key wait for each other (the
// primary key), so they agree on one region. It returns an *ledger.Error
// with CodeIdempotencyKeyReused when the first claim's fingerprint is
// another request's.
func (s *Store) ClaimAccountKey(ctx context.Context, client, key string, fingerprint []byte, region string) (string, error) {
	var first string
	var fp []byte
	var err error
	// A claim that waited for a concurrent one inserts nothing, and its
	// statement's snapshot, taken before the wait, does not see that
	// one's row either: the next statement does.
	for try := 0; try < 3; try++ {
		err = s.pool.QueryRow(ctx, `
			WITH claim AS (
				INSERT INTO account_keys (client_id, key, fingerprint, region) VALUES ($1, $2, $3, $4)
				ON CONFLICT (client_id, key) DO NOTHING
				RETURNING region, fingerprint)
			SELECT region, fingerprint FROM claim
			UNION ALL
			SELECT region, fingerprint FROM account_keys WHERE client_id = $1 AND key = $2`,
			client, key, fingerprint, region).Scan(&first, &fp)
		if !errors.Is(err, pgx.ErrNoRows) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("claim account key: %w", err)
	}
	if !bytes.Equal(fp, fingerprint) {
		return "", ledger.Errorf(ledger.CodeIdempotencyKeyReused, "the Idempotency-Key opened an account for a different request")
	}
	return first, nil
}
