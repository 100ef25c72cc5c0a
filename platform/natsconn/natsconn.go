// Package natsconn opens a service's connection to its region's
// nats-server, with the same options in every service: reconnect forever
// at ReconnectWait, log in as the service's user (platform/natsauth), at
// start wait a bounded time for a server that is not up yet, and log the
// connection's asynchronous errors (permission violations, slow consumers)
// and its disconnects and reconnects through the service's logger. Given
// the authority of the servers' certificates (Config.CAFile, --nats-ca), it
// requires TLS and verifies them.
package natsconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/startup"
)

// ReconnectWait is how long a lost connection waits between reconnect
// attempts (plus the client's jitter). It is short: a region's services
// should be back on a restarted nats-server within a second.
const ReconnectWait = 100 * time.Millisecond

// Config is one connection.
type Config struct {
	URL      string
	User     string // the service's user (platform/natsauth); empty for a server without users
	Password string
	// CAFile is the PEM file of the authority that signs the servers'
	// certificates. Set, the connection requires TLS and verifies each
	// server's certificate with it; empty, it uses TLS only when the
	// server asks for it, verified with the system's authorities.
	CAFile string
	// Name is the client name the server shows (paymesh-<service>-<region>).
	Name string
	// Timeout bounds how long Connect waits for the server to answer
	// (0: one attempt).
	Timeout time.Duration
	Log     *slog.Logger // the service's logger (nil: slog.Default())
}

// Connect connects to cfg.URL, retrying until cfg.Timeout has passed while
// the server does not answer, and logs one line when it starts waiting. It
// returns the last error, wrapped with the URL, when the time is up or ctx
// ends, and at once when the server refuses the login.
func Connect(ctx context.Context, cfg Config) (*nats.Conn, error) {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	opts := append(natsauth.ConnectOptions(cfg.User, cfg.Password), nats.Name(cfg.Name),
		nats.MaxReconnects(-1), nats.ReconnectWait(ReconnectWait), nats.ErrorHandler(asyncErrors(log, cfg.Name)),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil { // nil: the service closed it
				log.Warn("nats disconnected", "conn", cfg.Name, "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "conn", cfg.Name, "server", nc.ConnectedUrlRedacted())
		}))
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	var nc *nats.Conn
	err := startup.Wait(ctx, cfg.Timeout, cfg.Log, "waiting for nats at "+cfg.URL, func() error {
		var err error
		nc, err = nats.Connect(cfg.URL, opts...)
		var badCert *tls.CertificateVerificationError
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrSecureConnRequired) || errors.Is(err, nats.ErrSecureConnWanted) || errors.As(err, &badCert) {
			return startup.Permanent(err) // a refused login or certificate, or a server without TLS: waiting will not fix it
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

// asyncErrors logs an error the server sends outside any call: a publish
// or subscription its user may not make, or a subscription that fell
// behind (a slow consumer, whose messages the client dropped). Without it
// nats.go prints these to stderr, outside the service's log.
func asyncErrors(log *slog.Logger, name string) nats.ErrHandler {
	return func(nc *nats.Conn, sub *nats.Subscription, err error) {
		args := []any{"conn", name, "err", err}
		if sub != nil {
			args = append(args, "subject", sub.Subject)
		}
		log.Warn("nats async error", args...)
	}
}
