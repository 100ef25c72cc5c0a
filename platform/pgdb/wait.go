package pgdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paymesh/paymesh/platform/startup"
)

// Wait returns once the server at url accepts a connection to its
// database, retrying for at most timeout while it does not answer, and logs
// one line when it starts waiting. It returns the last error, with the
// redacted URL, when the time is up or ctx ends, and at once when the
// server answers but refuses: a database that does not exist or a login
// that fails will not fix themselves.
func Wait(ctx context.Context, url string, timeout time.Duration, log *slog.Logger) error {
	err := startup.Wait(ctx, timeout, log, "waiting for postgres at "+Redact(url), func() error {
		err := Reachable(ctx, url, 5*time.Second)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code != "57P03" { // 57P03: the server is starting up
			return startup.Permanent(err)
		}
		return err
	})
	var late *startup.Timeout
	switch {
	case err == nil:
		return nil
	case errors.As(err, &late):
		return fmt.Errorf("postgres %s: not reachable within %s: %w", Redact(url), late.After, late.Err)
	}
	return fmt.Errorf("postgres %s: %w", Redact(url), err)
}

// Reachable reports whether a server answers at url within the timeout.
func Reachable(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}
