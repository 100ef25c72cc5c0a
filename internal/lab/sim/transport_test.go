package sim

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/lab/certs"
	"github.com/paymesh/paymesh/internal/testbed/pgserver"
)

// natsServer starts an in-process nats-server with a monitor port, with
// TLS required of clients when tlsCfg is set, and a client connected to
// it; it returns the monitor's base URL.
func natsServer(t *testing.T, tlsCfg *tls.Config, ca string) string {
	t.Helper()
	cluster := server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: -1}
	if tlsCfg != nil {
		cluster.TLSConfig, cluster.TLSTimeout = tlsCfg, 5
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, HTTPHost: "127.0.0.1", HTTPPort: -1, ServerName: "n1",
		NoLog: true, NoSigs: true, TLSConfig: tlsCfg, TLS: tlsCfg != nil, TLSTimeout: 5, Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	opts := []nats.Option{nats.Name("probe-client")}
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return "http://" + s.MonitorAddr().String()
}

// pki makes a CA and one loopback certificate in a temporary folder.
func pki(t *testing.T) (dir string, srv certs.Server) {
	t.Helper()
	dir = t.TempDir()
	srv = certs.Server{Name: "srv", Hosts: []string{"127.0.0.1", "localhost"}}
	if _, err := certs.Make(certs.Options{Dir: dir}, []certs.Server{srv}); err != nil {
		t.Fatal(err)
	}
	return dir, srv
}

// TestNATSTransport reads real servers: one that requires TLS, whose
// client runs TLS, passes; one without TLS is named with its plain
// client.
func TestNATSTransport(t *testing.T) {
	dir, srv := pki(t)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, srv.CertFile()), filepath.Join(dir, srv.KeyFile()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	secure, err := natsTransport(ctx, "secure", natsServer(t, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, filepath.Join(dir, certs.CAFile)))
	if err != nil {
		t.Fatal(err)
	}
	if !secure.ClientTLS || !secure.Routes || !secure.RouteTLS || secure.Conns != 1 || len(secure.Plain) != 0 || len(secure.TLSVersions) != 1 {
		t.Fatalf("TLS server: %+v, want TLS required of clients and routes, and its one client on TLS", secure)
	}
	if p := (Transport{NATS: []NATSTransport{secure}}).problems(); len(p) != 1 || !strings.Contains(p[0], "no Postgres") {
		t.Fatalf("TLS server: problems %q, want only the missing Postgres", p)
	}
	plain, err := natsTransport(ctx, "plain", natsServer(t, nil, ""))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(Transport{NATS: []NATSTransport{plain}}.problems(), "\n")
	for _, want := range []string{"plain: does not require TLS of its clients", "plain: cluster routes without TLS", "plain: a client connected without TLS: probe-client"} {
		if !strings.Contains(got, want) {
			t.Errorf("plain server: problems %q, want %q", got, want)
		}
	}
	if _, err := natsTransport(ctx, "gone", "http://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("no server: got %v, want an error naming it", err)
	}
}

// TestPostgresTransport reads real servers: a throwaway cluster with TLS,
// a password and hostssl scram-sha-256 rules passes; one with the default
// trust and plain connections is named for each.
func TestPostgresTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL clusters")
	}
	if err := pgserver.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	dir, srv := pki(t)
	hba := filepath.Join(root(t), "deploy", "postgres", "pg_hba.conf")
	open := func(o pgserver.ThrowawayOptions) *pgxpool.Pool {
		tw, err := pgserver.StartThrowawayWith(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tw.Stop() })
		pool, err := pgxpool.New(ctx, tw.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	secure, err := postgresTransport(ctx, "eu", open(pgserver.ThrowawayOptions{Password: "pw", CertFile: filepath.Join(dir, srv.CertFile()),
		KeyFile: filepath.Join(dir, srv.KeyFile()), CAFile: filepath.Join(dir, certs.CAFile), HBAFile: hba}))
	if err != nil {
		t.Fatal(err)
	}
	if secure.Conns == 0 || len(secure.Plain) != 0 || len(secure.Loose) != 0 || !secure.SCRAM {
		t.Fatalf("TLS cluster: %+v, want its connections on TLS, no loose rule, a scram verifier", secure)
	}
	plain, err := postgresTransport(ctx, "us", open(pgserver.ThrowawayOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(Transport{Postgres: []PostgresTransport{plain}}.problems(), "\n")
	for _, want := range []string{"postgres us: a connection without TLS", "postgres us: hba rule host trust", "postgres us: the services' role stores no scram-sha-256 verifier"} {
		if !strings.Contains(got, want) {
			t.Errorf("trust cluster: problems %q, want %q", got, want)
		}
	}
}
