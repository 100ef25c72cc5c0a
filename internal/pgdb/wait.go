package pgdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// waitEvery is the pause between Wait's attempts.
const waitEvery = 250 * time.Millisecond

// Wait returns once the server at url accepts a connection to its
// database, retrying for at most timeout while it does not answer, and logs
// one line when it starts waiting. It returns the last error, with the
// redacted URL, when the time is up or ctx ends, and at once when the
// server answers but refuses: a database that does not exist or a login
// that fails will not fix themselves.
func Wait(ctx context.Context, url string, timeout time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(timeout)
	for logged := false; ; {
		err := Reachable(ctx, url, 5*time.Second)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code != "57P03" { // 57P03: the server is starting up
			return fmt.Errorf("postgres %s: %w", Redact(url), err)
		}
		if time.Now().Add(waitEvery).After(deadline) {
			return fmt.Errorf("postgres %s: not reachable within %s: %w", Redact(url), timeout, err)
		}
		if !logged && log != nil {
			log.Warn("waiting for postgres at "+Redact(url), "timeout", timeout, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres %s: %w (last error: %v)", Redact(url), ctx.Err(), err)
		case <-time.After(waitEvery):
		}
	}
}
