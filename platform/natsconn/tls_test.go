package natsconn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/lab/certs"
	"github.com/paymesh/paymesh/platform/natsconn"
)

// startServer runs a nats-server on a free loopback port, with TLS
// required when tlsCfg is not nil, and returns its client URL.
func startServer(t *testing.T, tlsCfg *tls.Config) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, TLSConfig: tlsCfg, TLS: tlsCfg != nil, TLSTimeout: 5})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(time.Minute) {
		t.Fatal("nats-server not ready within a minute")
	}
	t.Cleanup(s.Shutdown)
	return s.ClientURL()
}

// makePKI makes a CA and a certificate for 127.0.0.1 in a folder of its
// own, and returns the folder.
func makePKI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := certs.Make(certs.Options{Dir: dir}, []certs.Server{{Name: "nats", Hosts: []string{"127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestConnectTLS: with CAFile, Connect verifies the server's certificate
// with that authority and runs over TLS; a certificate of another
// authority and a server without TLS are refused at once, not waited on.
func TestConnectTLS(t *testing.T) {
	dir := makePKI(t)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "nats.pem"), filepath.Join(dir, "nats-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	tlsURL := startServer(t, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	ca := filepath.Join(dir, certs.CAFile)

	nc, err := natsconn.Connect(context.Background(), natsconn.Config{URL: tlsURL, CAFile: ca, Name: "test", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("the server's own authority: %v", err)
	}
	state, err := nc.TLSConnectionState()
	nc.Close()
	if err != nil || !state.HandshakeComplete || len(state.PeerCertificates) == 0 {
		t.Fatalf("connected without a verified TLS session: %v (%+v)", err, state)
	}

	t.Run("AnotherAuthority", func(t *testing.T) {
		other := filepath.Join(makePKI(t), certs.CAFile)
		began := time.Now()
		_, err := natsconn.Connect(context.Background(), natsconn.Config{URL: tlsURL, CAFile: other, Name: "test", Timeout: 20 * time.Second})
		var bad *tls.CertificateVerificationError
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &bad) && !errors.As(err, &unknown) {
			t.Fatalf("got %v, want a certificate verification error", err)
		}
		if took := time.Since(began); took > 10*time.Second {
			t.Errorf("refused after %s, want at once", took)
		}
	})
	t.Run("ServerWithoutTLS", func(t *testing.T) {
		plain := startServer(t, nil)
		began := time.Now()
		_, err := natsconn.Connect(context.Background(), natsconn.Config{URL: plain, CAFile: ca, Name: "test", Timeout: 20 * time.Second})
		if !errors.Is(err, nats.ErrSecureConnWanted) || !strings.Contains(err.Error(), plain) {
			t.Fatalf("got %v, want %v naming %s", err, nats.ErrSecureConnWanted, plain)
		}
		if took := time.Since(began); took > 10*time.Second {
			t.Errorf("refused after %s, want at once", took)
		}
	})
	t.Run("NoCAFile", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "none.pem")
		if _, err := natsconn.Connect(context.Background(), natsconn.Config{URL: tlsURL, CAFile: missing, Name: "test"}); !errors.Is(err, os.ErrNotExist) && (err == nil || !strings.Contains(err.Error(), "none.pem")) {
			t.Fatalf("got %v, want an error naming the missing file", err)
		}
	})
}
