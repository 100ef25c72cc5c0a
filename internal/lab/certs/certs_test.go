package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/deploy/regions"
)

func TestServers(t *testing.T) {
	table, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, s := range Servers(table) {
		got[s.Name] = s.Hosts
	}
	if want := 1 + 2*len(table.Regions); len(got) != want {
		t.Fatalf("%d servers, want %d: %v", len(got), want, got)
	}
	for _, r := range table.Regions {
		for _, node := range r.NodeNames() {
			if !slices.Contains(got["nats-"+r.Name], node) {
				t.Errorf("nats-%s does not name node %s: %v", r.Name, node, got["nats-"+r.Name])
			}
		}
		if !slices.Contains(got["nats-hub"], "wan-"+r.Name) {
			t.Errorf("the hub's certificate does not name wan-%s, the host region %s's leafnodes dial: %v", r.Name, r.Name, got["nats-hub"])
		}
		// One certificate for the region's formation: its monitor and
		// every data node (the clients' multi-host URL verifies each, the
		// keepers the monitor, a standby its primary), and loopback.
		want := append(append([]string{r.PostgresMonitorName()}, r.PostgresNodeNames()...), loopbackHosts...)
		if pg := got["postgres-"+r.Name]; !slices.Equal(pg, want) {
			t.Errorf("postgres-%s names %v, want %v", r.Name, pg, want)
		}
		if len(r.PostgresNodeNames()) < 2 {
			t.Errorf("region %s: %d postgres nodes, want a formation", r.Name, len(r.PostgresNodeNames()))
		}
	}
}

// TestMake makes the files, checks every certificate against the
// authority for each of its hosts, and serves a TLS handshake with one.
func TestMake(t *testing.T) {
	dir, caDir := t.TempDir(), t.TempDir()
	servers := []Server{{Name: "nats-eu", Hosts: []string{"nats-eu-1", "nats-eu-2", "127.0.0.1"}}, {Name: "postgres-eu", Hosts: []string{"postgres-eu-monitor", "postgres-eu-1", "postgres-eu-2", "::1"}}}
	m, err := Make(Options{Dir: dir, CADir: caDir}, servers)
	if err != nil {
		t.Fatal(err)
	}
	if !m.NewCA || len(m.Files) != 2+2*len(servers) {
		t.Fatalf("made %+v, want a new authority and %d files", m, 2+2*len(servers))
	}
	if _, err := os.Stat(filepath.Join(dir, caKeyFile)); err == nil {
		t.Errorf("the authority's key is in the servers' folder %s", dir)
	}
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)
	for _, s := range servers {
		c := readCert(t, filepath.Join(dir, s.CertFile()))
		for _, h := range s.Hosts {
			for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := c.Verify(x509.VerifyOptions{DNSName: h, Roots: pool, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
					t.Errorf("%s for %s (usage %v): %v", s.Name, h, use, err)
				}
			}
		}
		if _, err := c.Verify(x509.VerifyOptions{DNSName: "nats-us-1", Roots: pool}); err == nil {
			t.Errorf("%s is valid for nats-us-1, which it does not name", s.Name)
		}
		fi, err := os.Stat(filepath.Join(dir, s.KeyFile()))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o640 {
			t.Errorf("%s: mode %v, want 0640", s.KeyFile(), fi.Mode().Perm())
		}
	}

	// A real handshake: the server presents nats-eu's pair, the client
	// verifies it for 127.0.0.1 with ca.pem only.
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "nats-eu.pem"), filepath.Join(dir, "nats-eu-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok")) // the handshake runs here
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatalf("handshake with the made certificate: %v", err)
	}
	b, _ := io.ReadAll(conn)
	conn.Close()
	if string(b) != "ok" {
		t.Fatalf("read %q over TLS, want ok", b)
	}
	// Without the authority the same handshake fails.
	if c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: x509.NewCertPool()}); err == nil {
		c.Close()
		t.Fatal("a client without ca.pem accepted the certificate")
	}
}

// TestMakeAgain reuses the authority of an earlier run, so that servers
// started with the earlier files stay trusted.
func TestMakeAgain(t *testing.T) {
	dir, caDir := t.TempDir(), t.TempDir()
	o := Options{Dir: dir, CADir: caDir}
	servers := []Server{{Name: "nats-hub", Hosts: []string{"nats-hub"}}}
	if _, err := Make(o, servers); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, CAFile))
	m, err := Make(o, servers)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if m.NewCA || !bytes.Equal(before, after) {
		t.Fatalf("a second run made a new authority (NewCA %v, ca.pem changed %v)", m.NewCA, !bytes.Equal(before, after))
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(before)
	if _, err := readCert(t, filepath.Join(dir, "nats-hub.pem")).Verify(x509.VerifyOptions{DNSName: "nats-hub", Roots: pool}); err != nil {
		t.Fatalf("the second run's certificate under the first run's authority: %v", err)
	}
}

func TestMakeRefuses(t *testing.T) {
	servers := []Server{{Name: "nats-hub", Hosts: []string{"nats-hub"}}}
	t.Run("NoDir", func(t *testing.T) {
		if _, err := Make(Options{}, servers); err == nil {
			t.Fatal("no error without a folder")
		}
	})
	t.Run("HalfAnAuthority", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := Make(Options{Dir: dir}, servers); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(dir, caKeyFile)); err != nil {
			t.Fatal(err)
		}
		_, err := Make(Options{Dir: dir}, servers)
		if err == nil || !strings.Contains(err.Error(), "authority's key") {
			t.Fatalf("got %v, want an error naming the authority's missing key", err)
		}
	})
	t.Run("NotPEM", func(t *testing.T) {
		dir := t.TempDir()
		for _, f := range []string{CAFile, caKeyFile} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("not pem"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Make(Options{Dir: dir}, servers); err == nil || !strings.Contains(err.Error(), "no PEM block") {
			t.Fatalf("got %v, want no PEM block", err)
		}
	})
	t.Run("NoHost", func(t *testing.T) {
		if _, err := Make(Options{Dir: t.TempDir()}, []Server{{Name: "x"}}); err == nil || !strings.Contains(err.Error(), "no host") {
			t.Fatalf("got %v, want no host", err)
		}
	})
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
