package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/paymesh/paymesh/platform/secure"
	"github.com/paymesh/paymesh/services/receiver/receiverd"
)

// receiverCmd runs the reference webhook receiver: a client's side of the
// webhooks, which applies each event once in its own database.
type receiverCmd struct {
	PostgresURL string        `name:"postgres-url" env:"PAYMESH_RECEIVER_POSTGRES_URL" required:"" help:"The receiver's own database (not a region's): its inbox of event IDs and the toy shop's orders, migrated at start."`
	Secrets     []string      `name:"secret" env:"PAYMESH_RECEIVER_SECRETS" required:"" help:"The endpoint's signing secret (whsec_..., shown once when the endpoint is created); while it is rotated, the new and the old, comma-separated."`
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
	srv, err := receiverd.Open(ctx, receiverd.Config{Listen: c.Listen, MetricsListen: metricsListen(c.Metrics, 0), PostgresURL: c.PostgresURL,
		ConnectTimeout: c.ConnectTimeout, Secrets: c.Secrets, GapTimeout: c.GapTimeout, Log: log.With("service", "receiver")})
	if err != nil {
		return err
	}
	return run(ctx, srv)
}
