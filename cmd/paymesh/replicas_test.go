package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/paymesh/paymesh/platform/natsauth"
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

// TestStreamLimitFlags: a stream limit, a saga step bound or the expected
// standbys below 0 fails the service's command with an error naming the flags, before it
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
		{"ledger", "--postgres-standbys=-1", "--postgres-standbys -1: want 0 (a single server) or more"},
	}
	for _, c := range cases {
		if err := runService(t, c.service, c.flag); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: got %v, want %q", c.service, c.flag, err, c.want)
		}
	}
}

// TestInsecureRefused: `paymesh ledger|router|api` with the published
// development passwords, anonymous NATS, NATS without TLS to another host,
// Postgres without TLS or (the API)
// plain HTTP on a public address refuse to start, naming each, before they
// connect to anything; --insecure-dev lets them go on (here to the
// connection that leads nowhere).
func TestInsecureRefused(t *testing.T) {
	pg := "postgres://127.0.0.1:1/x?sslmode=disable"
	cases := []struct {
		service string
		args    []string
		want    []string
	}{
		{"ledger", []string{"--nats-url", "tls://nats-eu-1.example:4222,nats://nats-eu-2.example:4222"},
			[]string{"NATS without a user (--nats-user)", "NATS without TLS to nats-eu-2.example:4222", "Postgres URL that allows a connection without TLS"}},
		{"router", []string{"--nats-user", "router-eu", "--nats-password", natsauth.DevPassword("router-eu")},
			[]string{"NATS user router-eu has its published development password"}},
		{"api", []string{"--nats-user", "api-eu", "--nats-password", natsauth.DevPassword("api-eu"), "--ops-nats-user", "ops-eu",
			"--ops-nats-password", natsauth.DevPassword("ops-eu"), "--listen", "0.0.0.0:8080"},
			[]string{"api-eu has its published", "ops-eu has its published development password (--ops-nats-user)", "plain HTTP on 0.0.0.0:8080"}},
	}
	for _, tc := range cases {
		t.Run(tc.service, func(t *testing.T) {
			err := runService(t, tc.service, append([]string{"--postgres-url", pg}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), "refusing to start with insecure settings") {
				t.Fatalf("got %v, want a refusal", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not name %q: %v", w, err)
				}
			}
			err = runService(t, tc.service, append([]string{"--postgres-url", pg, "--insecure-dev"}, tc.args...)...)
			if err == nil || strings.Contains(err.Error(), "insecure") {
				t.Errorf("with --insecure-dev: got %v, want the failed connection", err)
			}
		})
	}
}

// TestNATSCAFlag: --nats-ca reaches every command that connects to NATS,
// and a file that does not exist is refused at parse time, naming the
// flag.
func TestNATSCAFlag(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("-"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	c := parse(t, "ledger", "--nats-ca", ca)
	got["ledger"] = c.Ledger.NATSCA
	c = parse(t, "router", "--nats-ca", ca)
	got["router"] = c.Router.NATSCA
	c = parse(t, "api", "--nats-ca", ca)
	got["api"] = c.API.NATSCA
	c = parse(t, "dlq", "list", "--nats-ca", ca)
	got["dlq"] = c.DLQ.List.NATSCA
	for cmd, v := range got {
		if v != ca {
			t.Errorf("%s: --nats-ca read as %q, want %q", cmd, v, ca)
		}
	}
	for _, cmd := range [][]string{{"ledger"}, {"router"}, {"api"}, {"dlq", "list"}} {
		var cl cli
		k, err := kong.New(&cl, kong.Name("paymesh"), cliVars)
		if err != nil {
			t.Fatal(err)
		}
		_, err = k.Parse(append(cmd, "--nats-ca", filepath.Join(t.TempDir(), "none.pem")))
		if err == nil || !strings.Contains(err.Error(), "--nats-ca") {
			t.Errorf("%v with a missing CA file: got %v, want an error naming --nats-ca", cmd, err)
		}
	}
}
