package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// parse parses args into a fresh cli as main does, without exiting.
func parse(t *testing.T, args ...string) *cli {
	t.Helper()
	var c cli
	k, err := kong.New(&c, kong.Name("paymesh"), cliVars)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return &c
}

// TestStreamReplicasFlag: --stream-replicas defaults to 1, is read from
// PAYMESH_STREAM_REPLICAS, and a count JetStream would refuse (0, negative,
// above 5) fails each service's command with an error naming the flag,
// before it connects to anything (the NATS and Postgres URLs lead nowhere).
func TestStreamReplicasFlag(t *testing.T) {
	for _, service := range []string{"ledger", "router", "api"} {
		t.Run(service, func(t *testing.T) {
			replicas := func(c *cli) int {
				switch service {
				case "ledger":
					return c.Ledger.StreamReplicas
				case "router":
					return c.Router.StreamReplicas
				}
				return c.API.StreamReplicas
			}
			if got := replicas(parse(t, service)); got != 1 {
				t.Errorf("default: got %d, want 1", got)
			}
			if got := replicas(parse(t, service, "--stream-replicas", "3")); got != 3 {
				t.Errorf("--stream-replicas 3: got %d, want 3", got)
			}
			t.Setenv("PAYMESH_STREAM_REPLICAS", "5")
			if got := replicas(parse(t, service)); got != 5 {
				t.Errorf("PAYMESH_STREAM_REPLICAS=5: got %d, want 5", got)
			}
			tab, ids := defaultRegions(t)
			for _, bad := range []string{"0", "-1", "6"} {
				c := parse(t, service, "--stream-replicas="+bad, "--nats-url", "nats://127.0.0.1:1", "--postgres-url", "postgres://127.0.0.1:1/x",
					"--connect-timeout", "0s")
				var err error
				switch service {
				case "ledger":
					err = c.Ledger.Run(context.Background(), tab, ids, slog.New(slog.DiscardHandler))
				case "router":
					err = c.Router.Run(context.Background(), tab, ids, slog.New(slog.DiscardHandler))
				default:
					err = c.API.Run(context.Background(), tab, ids, slog.New(slog.DiscardHandler))
				}
				if err == nil || !strings.Contains(err.Error(), "--stream-replicas: stream replicas "+bad+": want 1 to 5") {
					t.Errorf("--stream-replicas %s: got %v, want the flag's error", bad, err)
				}
			}
		})
	}
}

// TestNATSURLHelp: the services' --nats-url says it takes every server of
// the region, comma-separated (nats.go's Connect does; natsconn passes the
// list through).
func TestNATSURLHelp(t *testing.T) {
	var c cli
	k, err := kong.New(&c, kong.Name("paymesh"), cliVars)
	if err != nil {
		t.Fatal(err)
	}
	for _, service := range []string{"ledger", "router", "api"} {
		var help strings.Builder
		k.Stdout = &help
		k.Exit = func(int) {}
		_, _ = k.Parse([]string{service, "--help"})
		if !strings.Contains(help.String(), "comma-separated list") || !strings.Contains(help.String(), "--stream-replicas=1") {
			t.Errorf("%s --help: want --nats-url's comma-separated list and --stream-replicas=1, got\n%s", service, help.String())
		}
	}
}

// runService runs a service's command parsed from args, with NATS and
// Postgres URLs that lead nowhere, and returns its error.
func runService(t *testing.T, service string, args ...string) error {
	t.Helper()
	tab, ids := defaultRegions(t)
	c := parse(t, append([]string{service, "--nats-url", "nats://127.0.0.1:1", "--postgres-url", "postgres://127.0.0.1:1/x",
		"--connect-timeout", "0s"}, args...)...)
	switch service {
	case "ledger":
		return c.Ledger.Run(context.Background(), tab, ids, slog.New(slog.DiscardHandler))
	case "router":
		return c.Router.Run(context.Background(), tab, ids, slog.New(slog.DiscardHandler))
	}
	return c.API.Run(context.Background(), tab, ids, slog.New(slog.DiscardHandler))
}

// TestStreamLimitFlags: a stream limit or a saga step bound below 0 fails the service's command with an error naming the flags, before it
// connects to anything.
func TestStreamLimitFlags(t *testing.T) {
	cases := []struct {
		service, flag, want string
	}{
		{"ledger", "--stream-max-msgs=-1", "--stream-max-msgs, --stream-max-bytes: stream limits"},
		{"router", "--stream-max-bytes=-1", "--stream-max-msgs, --stream-max-bytes: stream limits"},
		{"api", "--stream-max-msgs=-5", "--stream-max-msgs, --stream-max-bytes: stream limits"},
		{"ledger", "--dlq-max-msgs=-1", "--dlq-max-msgs, --dlq-max-bytes: stream limits"},
		{"ledger", "--dlq-max-bytes=-1", "--dlq-max-msgs, --dlq-max-bytes: stream limits"},
		{"ledger", "--max-step-deliver=-1", "--max-step-deliver -1, --max-parked-deliver 1000: want 0 (the default) or more"},
		{"ledger", "--max-parked-deliver=-1", "--max-step-deliver 100, --max-parked-deliver -1: want 0 (the default) or more"},
	}
	for _, c := range cases {
		if err := runService(t, c.service, c.flag); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: got %v, want %q", c.service, c.flag, err, c.want)
		}
	}
}
