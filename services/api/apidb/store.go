// Package apidb is the API's Postgres adapter: its clients and their
// idempotency keys, in the region's database beside the ledger's tables,
// with its own embedded, numbered migrations (recorded in
// api_schema_version). It implements api.Store, and the ledger's
// postgres.Answers: the apply transaction's record of a request's first
// response, rendered by the API.
//
// The idempotency-key reads that a transfer request makes with the ledger's
// (its source account, the transfer its key made) use the ledger adapter's
// queue functions, in one round trip with the key's claim.
package apidb

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/platform/pgdb"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationTable records which of the API's migrations a database has.
const MigrationTable = "api_schema_version"

// Migrations returns the API's migration set. It has no reference to the
// ledger's tables and may run before or after the ledger's set.
func Migrations() pgdb.Migration {
	sub, _ := fs.Sub(migrationFiles, "migrations") // cannot fail: the path is embedded
	return pgdb.Migration{FS: sub, Table: MigrationTable}
}

// Pending reports whether an API migration is not applied yet on the
// database (pgdb.Pending).
func (s *Store) Pending(ctx context.Context) (bool, error) {
	return pgdb.Pending(ctx, s.pool, Migrations())
}

// Store is the API's Postgres adapter. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	claims claimGroup
}

// New returns a Store over pool, a pool of the region's database.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Migrate applies the API's migrations. It returns an error naming the
// migration that failed.
func (s *Store) Migrate(ctx context.Context) error {
	return pgdb.Migrate(ctx, s.pool, Migrations())
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// maxAttempts bounds the runs of one transaction.
const maxAttempts = 8

// transact runs fn in a READ COMMITTED transaction, and runs it again on
// 40001 (serialization failure), 40P01 (deadlock), 55P03 (lock timeout),
// 23505 (a unique key raced by a concurrent transaction: the rerun sees the
// winner's row) and a connection lost before COMMIT. When COMMIT goes
// unanswered, committed tells whether it took effect (false: run again);
// its error ends the runs.
func (s *Store) transact(ctx context.Context, op string, fn func(pgx.Tx) error, committed func(context.Context) (bool, error)) error {
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return struct{}{}, retryable(err)
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback(ctx)
			return struct{}{}, retryable(err)
		}
		err = tx.Commit(ctx)
		var pgErr *pgconn.PgError
		if err == nil || errors.As(err, &pgErr) || ctx.Err() != nil {
			return struct{}{}, retryable(err)
		}
		if committed == nil {
			return struct{}{}, backoff.Permanent(fmt.Errorf("commit outcome unknown: %w", err))
		}
		// The server never answered the COMMIT: read back what happened.
		ok, rerr := committed(ctx)
		switch {
		case rerr != nil:
			return struct{}{}, backoff.Permanent(fmt.Errorf("commit outcome unknown: %v (the check failed: %w)", err, rerr))
		case ok:
			return struct{}{}, nil
		}
		return struct{}{}, err // not applied: run again
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{
		InitialInterval: 2 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 200 * time.Millisecond,
	}), backoff.WithMaxTries(maxAttempts), backoff.WithMaxElapsedTime(0))
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// retryable returns err as it is when running the transaction again may
// succeed, and marked permanent otherwise (nil stays nil).
func retryable(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	case errors.As(err, &pgErr):
		switch pgErr.Code {
		case "40001", "40P01", "55P03", "23505":
			return err
		}
	case pgconn.SafeToRetry(err), isConnErr(err):
		return err
	}
	return backoff.Permanent(err)
}

// isConnErr reports whether err is a lost or refused connection: the
// transaction, if one was open, rolled back.
func isConnErr(err error) bool {
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
