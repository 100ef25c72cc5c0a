package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/secure"
	"github.com/paymesh/paymesh/services/receiver/receiverd"
)

// receiverCmd runs the reference webhook receiver: a client's side of the
// webhooks, which applies each event once in its own database.
type receiverCmd struct {
	PostgresURL string        `name:"postgres-url" env:"PAYMESH_RECEIVER_POSTGRES_URL" required:"" help:"The receiver's own database (not a region's): its inbox of event IDs and the toy shop's orders, migrated at start."`
	Database    string        `env:"PAYMESH_RECEIVER_DATABASE" help:"Use this database on --postgres-url's server instead, made if missing."`
	Secrets     []string      `name:"secret" env:"PAYMESH_RECEIVER_SECRETS" help:"The endpoint's signing secret (whsec_..., shown once when the endpoint is created); while it is rotated, the new and the old, comma-separated."`
	SecretFile  string        `name:"secret-file" env:"PAYMESH_RECEIVER_SECRET_FILE" type:"path" help:"A file of signing secrets, one per line (paymesh webhooks create --secret-file writes it), beside or instead of --secret."`
	Listen      string        `env:"PAYMESH_RECEIVER_LISTEN" default:"127.0.0.1:8090" help:"Address the deliveries are posted to (at /webhooks)."`
	Metrics     string        `name:"metrics-listen" env:"PAYMESH_RECEIVER_METRICS_LISTEN" default:"off" help:"Address of /metrics ('off' for none)."`
	GapTimeout  time.Duration `name:"gap-timeout" env:"PAYMESH_RECEIVER_GAP_TIMEOUT" default:"10m" help:"How long an event parked behind a missing earlier one waits before the gap is reported (logged, GET /gaps, paymesh_receiver_gaps)."`
	dependencyWait
	security
}

func (c *receiverCmd) Run(ctx context.Context, log *slog.Logger) error {
	if err := c.guard(secure.Settings{PostgresURL: c.PostgresURL, HTTPListen: c.Listen}, log); err != nil {
		return err
	}
	secrets, err := c.secrets()
	if err != nil {
		return err
	}
	dbURL := c.PostgresURL
	if c.Database != "" {
		if err := pgdb.Wait(ctx, c.PostgresURL, c.ConnectTimeout, log); err != nil {
			return err
		}
		if dbURL, err = pgdb.Ensure(ctx, c.PostgresURL, c.Database); err != nil {
			return err
		}
	}
	srv, err := receiverd.Open(ctx, receiverd.Config{Listen: c.Listen, MetricsListen: metricsListen(c.Metrics, 0), PostgresURL: dbURL,
		ConnectTimeout: c.ConnectTimeout, Secrets: secrets, GapTimeout: c.GapTimeout, Log: log.With("service", "receiver")})
	if err != nil {
		return err
	}
	return run(ctx, srv)
}

// secrets returns the secrets given by flag and those of the secret file,
// one per line; at least one is required.
func (c *receiverCmd) secrets() ([]string, error) {
	out := slices.Clone(c.Secrets)
	if c.SecretFile != "" {
		b, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("--secret-file: %w", err)
		}
		for line := range strings.Lines(string(b)) {
			if s := strings.TrimSpace(line); s != "" {
				out = append(out, s)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("a signing secret is required: --secret or --secret-file (PAYMESH_RECEIVER_SECRETS, PAYMESH_RECEIVER_SECRET_FILE)")
	}
	return out, nil
}
