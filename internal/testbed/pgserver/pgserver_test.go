package pgserver_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/lab/certs"
	"github.com/paymesh/paymesh/internal/testbed/pgserver"
	"github.com/paymesh/paymesh/platform/pgdb"
)

// TestThrowaway starts a cluster from the local binaries, uses it,
// restarts it in immediate mode on the same URL, and leaves nothing behind.
func TestThrowaway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	tw, err := pgserver.StartThrowaway(ctx)
	if err != nil {
		t.Skipf("no local PostgreSQL binaries: %v", err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("throwaway cluster not reachable: %v", err)
	}
	if _, err := pgdb.Create(ctx, tw.URL, "paymesh_probe", true); err != nil {
		t.Fatal(err)
	}
	if err := tw.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("not reachable after an immediate restart: %v", err)
	}
	if err := tw.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tw.Dir); !os.IsNotExist(err) {
		t.Fatalf("cluster folder %s still exists (%v)", tw.Dir, err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, time.Second); err == nil {
		t.Fatal("the cluster still answers after Stop")
	}
}

// TestThrowawayPort starts a cluster on a fixed port, and refuses a second
// one on the same port with an error that names it.
func TestThrowawayPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	if err := pgserver.Available(); err != nil {
		t.Skipf("no local PostgreSQL binaries: %v", err)
	}
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	tw, err := pgserver.StartThrowawayWith(ctx, pgserver.ThrowawayOptions{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Stop()
	if want := fmt.Sprintf("127.0.0.1:%d/", port); !strings.Contains(tw.URL, want) {
		t.Fatalf("URL %s, want it on %s", tw.URL, want)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("not reachable on port %d: %v", port, err)
	}
	_, err = pgserver.StartThrowawayWith(ctx, pgserver.ThrowawayOptions{Port: port})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(port)) {
		t.Fatalf("a second cluster on port %d: got %v, want an error naming the port", port, err)
	}
	if _, err := pgserver.StartThrowawayWith(ctx, pgserver.ThrowawayOptions{Port: 70000}); err == nil {
		t.Fatal("port 70000: got no error")
	}
}

// TestThrowawayTLSAndPassword starts a cluster with a password, TLS and
// an hba file of hostssl lines only: its URL connects over verified TLS
// as a scram-sha-256 user (after an immediate restart too), and a plain
// connection, a wrong password and an unknown authority are refused.
func TestThrowawayTLSAndPassword(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	if err := pgserver.Available(); err != nil {
		t.Skipf("no local PostgreSQL binaries: %v", err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	srv := certs.Server{Name: "pg", Hosts: []string{"127.0.0.1", "localhost"}}
	if _, err := certs.Make(certs.Options{Dir: dir}, []certs.Server{srv}); err != nil {
		t.Fatal(err)
	}
	hba := filepath.Join(dir, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte("local all all peer\nhostssl all all 127.0.0.1/32 scram-sha-256\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tw, err := pgserver.StartThrowawayWith(ctx, pgserver.ThrowawayOptions{
		Password: "pw with spaces & symbols", CertFile: filepath.Join(dir, srv.CertFile()), KeyFile: filepath.Join(dir, srv.KeyFile()),
		CAFile: filepath.Join(dir, certs.CAFile), HBAFile: hba, Settings: []string{"ssl_min_protocol_version=TLSv1.3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Stop()
	u, err := url.Parse(tw.URL)
	if err != nil || u.Query().Get("sslmode") != "verify-full" {
		t.Fatalf("URL %s (%v): want sslmode=verify-full", tw.URL, err)
	}
	check := func(when string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, tw.URL)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		defer conn.Close(ctx)
		var ssl bool
		var version, verifier string
		if err := conn.QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version); err != nil || !ssl || version != "TLSv1.3" {
			t.Fatalf("%s: ssl %v version %q (%v), want TLSv1.3 (the extra setting)", when, ssl, version, err)
		}
		if err := conn.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'`).Scan(&verifier); err != nil || !strings.HasPrefix(verifier, "SCRAM-SHA-256$") {
			t.Fatalf("%s: postgres's password is stored as %.14q (%v), want a SCRAM-SHA-256 verifier", when, verifier, err)
		}
	}
	check("started")
	refused := map[string]func(q url.Values, u *url.URL){
		"Plain":         func(q url.Values, u *url.URL) { q.Set("sslmode", "disable") },
		"WrongPassword": func(q url.Values, u *url.URL) { u.User = url.UserPassword("postgres", "wrong") },
		"OtherCA": func(q url.Values, u *url.URL) {
			other := t.TempDir()
			if _, err := certs.Make(certs.Options{Dir: other}, []certs.Server{srv}); err != nil {
				t.Fatal(err)
			}
			q.Set("sslrootcert", filepath.Join(other, certs.CAFile))
		},
	}
	for name, mut := range refused {
		t.Run(name, func(t *testing.T) {
			bad := *u
			q := bad.Query()
			mut(q, &bad)
			bad.RawQuery = q.Encode()
			if conn, err := pgx.Connect(ctx, bad.String()); err == nil {
				conn.Close(ctx)
				t.Fatalf("%s: connected, want a refusal", bad.Redacted())
			}
		})
	}
	if err := tw.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	check("restarted")
}

// TestThrowawayOptionsRefused: half a TLS setup, an authority without a
// certificate, a setting that is not name=value and a certificate that
// does not exist are refused, each named.
func TestThrowawayOptionsRefused(t *testing.T) {
	if err := pgserver.Available(); err != nil {
		t.Skipf("no local PostgreSQL binaries: %v", err)
	}
	cases := map[string]struct {
		o    pgserver.ThrowawayOptions
		want string
	}{
		"CertWithoutKey": {pgserver.ThrowawayOptions{CertFile: "/x.pem"}, "want both or neither"},
		"KeyWithoutCert": {pgserver.ThrowawayOptions{KeyFile: "/x-key.pem"}, "want both or neither"},
		"CAWithoutCert":  {pgserver.ThrowawayOptions{CAFile: "/ca.pem"}, "without a certificate"},
		"BadSetting":     {pgserver.ThrowawayOptions{Settings: []string{"ssl"}}, `setting "ssl": want name=value`},
		"MissingCert":    {pgserver.ThrowawayOptions{CertFile: "/nonexistent/x.pem", KeyFile: "/nonexistent/x-key.pem"}, "ssl_cert_file"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if name == "MissingCert" && testing.Short() {
				t.Skip("runs initdb")
			}
			tw, err := pgserver.StartThrowawayWith(context.Background(), tc.o)
			if err == nil {
				tw.Stop()
				t.Fatalf("started, want an error saying %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
