// Package natsconn opens a service's connection to its region's
// nats-server, with the same options in every service: reconnect forever
// at ReconnectWait, log in as the service's user (internal/platform/natsauth), and at
// start wait a bounded time for a server that is not up yet.
package natsconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/platform/natsauth"
	"github.com/paymesh/paymesh/internal/platform/startup"
)

// ReconnectWait is how long a lost connection waits between reconnect
// attempts (plus the client's jitter). It is short: a region's services
// should be back on a restarted nats-server within a second.
const ReconnectWait = 100 * time.Millisecond

// Config is one connection.
type Config struct {
	URL      string
	User     string // the service's user (internal/platform/natsauth); empty for a server without users
	Password string
	// Name is the client name the server shows (paymesh-<service>-<region>).
	Name string
	// Timeout bounds how long Connect waits for the server to answer
	// (0: one attempt).
	Timeout time.Duration
	Log     *slog.Logger
}

// Connect connects to cfg.URL, retrying until cfg.Timeout has passed while
// the server does not answer, and logs one line when it starts waiting. It
// returns the last error, wrapped with the URL, when the time is up or ctx
// ends, and at once when the server refuses the login.
func Connect(ctx context.Context, cfg Config) (*nats.Conn, error) {
	opts := append(natsauth.ConnectOptions(cfg.User, cfg.Password), nats.Name(cfg.Name),
		nats.MaxReconnects(-1), nats.ReconnectWait(ReconnectWait))
	var nc *nats.Conn
	err := startup.Wait(ctx, cfg.Timeout, cfg.Log, "waiting for nats at "+cfg.URL, func() error {
		var err error
		nc, err = nats.Connect(cfg.URL, opts...)
		if errors.Is(err, nats.ErrAuthorization) {
			return startup.Permanent(err)
		}
		return err
	})
	var late *startup.Timeout
	switch {
	case err == nil:
		return nc, nil
	case errors.As(err, &late):
		return nil, fmt.Errorf("nats %s: not reachable within %s: %w", cfg.URL, late.After, late.Err)
	}
	return nil, fmt.Errorf("nats %s: %w", cfg.URL, err)
}
