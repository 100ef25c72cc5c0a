// Package startup waits, when a service starts, for a dependency that is
// not up yet (a database, a nats-server, a schema its ledger migrates), a
// bounded time, logging once. paymesh's services use it so that they can
// start in any order instead of exiting or crash-looping.
package startup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Every is the pause between attempts.
const Every = 250 * time.Millisecond

// Timeout is the error Wait returns when the time is up: After is the
// bound, Err the last attempt's error.
type Timeout struct {
	After time.Duration
	Err   error
}

func (e *Timeout) Error() string { return fmt.Sprintf("not ready within %s: %v", e.After, e.Err) }

// Unwrap returns the last attempt's error.
func (e *Timeout) Unwrap() error { return e.Err }

// Permanent marks an error that waiting cannot mend (a refused login, a
// database that does not exist): Wait returns it at once.
func Permanent(err error) error { return backoff.Permanent(err) }

// Wait calls try until it succeeds, every Every for at most timeout (once
// when timeout <= 0), and logs waiting once (with log's Warn) when it
// starts waiting. It returns try's error at once when try marks it
// Permanent, a *Timeout when the time is up, and ctx's error, with the
// last attempt's, when ctx ends first.
func Wait(ctx context.Context, timeout time.Duration, log *slog.Logger, waiting string, try func() error) error {
	opts := []backoff.RetryOption{backoff.WithBackOff(backoff.NewConstantBackOff(Every))}
	if timeout <= 0 {
		opts = append(opts, backoff.WithMaxTries(1))
	} else {
		opts = append(opts, backoff.WithMaxElapsedTime(timeout))
	}
	logged, permanent := false, false
	var last error
	opts = append(opts, backoff.WithNotify(func(err error, _ time.Duration) {
		if !logged && log != nil {
			log.Warn(waiting, "timeout", timeout, "err", err)
		}
		logged = true
	}))
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		last = try()
		var perm *backoff.PermanentError
		permanent = errors.As(last, &perm)
		return struct{}{}, last
	}, opts...)
	switch {
	case err == nil || permanent:
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
	case timeout > 0:
		return &Timeout{After: timeout, Err: err}
	}
	return err
}
