// Package certs makes the development PKI of docker-compose.yml and of the
// process simulation (paymesh-lab certs): a certificate authority, and one
// certificate per server that the regions' links verify: the leafnode hub,
// each region's JetStream cluster and each region's Postgres formation. It uses Go's
// crypto/x509 only; nothing is downloaded.
//
// A deployment brings its own PKI (its certificate manager, its secret
// store): this package is the lab's, so that compose and the simulation
// run with TLS on every link instead of without.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/paymesh/paymesh/deploy/regions"
)

// File names in the output folder.
const (
	// CAFile is the authority's certificate, which every client and server
	// trusts.
	CAFile = "ca.pem"
	// caKeyFile is the authority's key, kept apart from the servers' files
	// (Options.CADir).
	caKeyFile = "ca-key.pem"
)

// Validity is how long the authority and each server certificate are
// valid from the time they are made.
const Validity = 365 * 24 * time.Hour

// Server is one certificate to make: its file name and the host names and
// addresses it is valid for.
type Server struct {
	// Name is the file's base name: <Name>.pem and <Name>-key.pem.
	Name string
	// Hosts are its DNS names and IP addresses (subject alternative
	// names).
	Hosts []string
}

// CertFile is the server's certificate file name in the output folder.
func (s Server) CertFile() string { return s.Name + ".pem" }

// KeyFile is the server's key file name in the output folder.
func (s Server) KeyFile() string { return s.Name + "-key.pem" }

// loopbackHosts are in every certificate: docker-compose publishes the
// ports on the host, and the process simulation reaches every server on
// 127.0.0.1.
var loopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// Servers returns the certificates the regions' topology needs, named as
// docker-compose.yml's services:
//   - nats-hub, the leafnode hub, which each region reaches through its
//     WAN link (wan-<region>): the link's name is the host a leafnode
//     remote verifies;
//   - nats-<region>, shared by the region's cluster nodes
//     (nats-<region>-1..N), for their clients and for the routes among
//     them (each node presents it and verifies the others');
//   - postgres-<region>, shared by the servers of the region's
//     pg_auto_failover formation: its monitor (postgres-<region>-monitor)
//     and its data nodes (postgres-<region>-1..N), which the clients
//     verify (sslmode=verify-full), the keepers verify on the monitor and
//     a standby verifies on the primary it streams from.
func Servers(t regions.Table) []Server {
	hub := Server{Name: "nats-hub", Hosts: []string{"nats-hub"}}
	var out []Server
	for _, r := range t.Regions {
		hub.Hosts = append(hub.Hosts, "wan-"+r.Name)
		pg := append([]string{r.PostgresMonitorName()}, r.PostgresNodeNames()...)
		out = append(out,
			Server{Name: "nats-" + r.Name, Hosts: append(r.NodeNames(), loopbackHosts...)},
			Server{Name: "postgres-" + r.Name, Hosts: append(pg, loopbackHosts...)})
	}
	hub.Hosts = append(hub.Hosts, loopbackHosts...)
	return append([]Server{hub}, out...)
}

// Options say where the files go.
type Options struct {
	// Dir receives ca.pem and each server's certificate and key. Keys are
	// written with mode 0640 (Postgres accepts a key owned by root and
	// readable by its group), certificates 0644.
	Dir string
	// CADir holds the authority's key, apart from Dir (which the servers
	// mount); "" keeps it in Dir.
	CADir string
	// Now is the start of the validity (zero: time.Now()).
	Now time.Time
}

// Made says what Make did.
type Made struct {
	// NewCA is true when the authority was created, false when an
	// existing one (from an earlier run) signed the certificates.
	NewCA bool
	// Files are the files written, in order.
	Files []string
}

// Make writes the authority (or reuses the one already in Options.Dir and
// Options.CADir, so that servers started from an earlier run's files stay
// trusted) and a fresh certificate and key for each server. It returns an
// error naming the file when a folder cannot be written, when an existing
// authority's files do not parse, or when only one of them exists.
func Make(o Options, servers []Server) (Made, error) {
	if o.Dir == "" {
		return Made{}, errors.New("certs: no output folder")
	}
	if o.CADir == "" {
		o.CADir = o.Dir
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	for _, d := range []string{o.Dir, o.CADir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Made{}, fmt.Errorf("certs: %w", err)
		}
	}
	var m Made
	ca, caKey, err := loadCA(o)
	if errors.Is(err, fs.ErrNotExist) {
		ca, caKey, err = newCA(o)
		m.NewCA = true
		m.Files = append(m.Files, filepath.Join(o.Dir, CAFile), filepath.Join(o.CADir, caKeyFile))
	}
	if err != nil {
		return Made{}, err
	}
	for _, s := range servers {
		if len(s.Hosts) == 0 {
			return Made{}, fmt.Errorf("certs: server %q has no host", s.Name)
		}
		if err := issue(o, s, ca, caKey); err != nil {
			return Made{}, err
		}
		m.Files = append(m.Files, filepath.Join(o.Dir, s.CertFile()), filepath.Join(o.Dir, s.KeyFile()))
	}
	return m, nil
}

// loadCA reads the authority of an earlier run. It returns an error
// matching fs.ErrNotExist when neither of its files exists.
func loadCA(o Options) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPath, keyPath := filepath.Join(o.Dir, CAFile), filepath.Join(o.CADir, caKeyFile)
	certPEM, certErr := os.ReadFile(certPath)
	keyPEM, keyErr := os.ReadFile(keyPath)
	switch {
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		return nil, nil, fs.ErrNotExist
	case certErr != nil:
		return nil, nil, fmt.Errorf("certs: the authority's certificate (its key %s exists): %v", keyPath, certErr) // %v: not fs.ErrNotExist, which means no authority
	case keyErr != nil:
		return nil, nil, fmt.Errorf("certs: the authority's key (its certificate %s exists): %v", certPath, keyErr)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("certs: %s or %s holds no PEM block", certPath, keyPath)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: %s: %w", certPath, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: %s: %w", keyPath, err)
	}
	if !ca.IsCA {
		return nil, nil, fmt.Errorf("certs: %s is no authority's certificate", certPath)
	}
	return ca, key, nil
}

// newCA makes and writes a self-signed authority.
func newCA(o Options) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "paymesh development CA", Organization: []string{"paymesh (development only)"}},
		NotBefore:             o.Now.Add(-time.Minute),
		NotAfter:              o.Now.Add(Validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: the authority: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: the authority: %w", err)
	}
	if err := writeKey(filepath.Join(o.CADir, caKeyFile), key, 0o600); err != nil {
		return nil, nil, err
	}
	if err := writePEM(filepath.Join(o.Dir, CAFile), "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	return ca, key, nil
}

// issue makes and writes one server's certificate and key, signed by ca.
// The certificate serves both ends of a connection (server and client
// authentication): a cluster node presents it on the routes it opens too.
func issue(o Options, s Server, ca *x509.Certificate, caKey *ecdsa.PrivateKey) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	notAfter := o.Now.Add(Validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.Name, Organization: []string{"paymesh (development only)"}},
		NotBefore:    o.Now.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range slices.Compact(slices.Clone(s.Hosts)) {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", s.Name, err)
	}
	if err := writeKey(filepath.Join(o.Dir, s.KeyFile()), key, 0o640); err != nil {
		return err
	}
	return writePEM(filepath.Join(o.Dir, s.CertFile()), "CERTIFICATE", der, 0o644)
}

// serial is a random 128-bit serial number.
func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey, mode os.FileMode) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", path, err)
	}
	return writePEM(path, "EC PRIVATE KEY", der, mode)
}

// writePEM writes one PEM block to path with mode, through a file beside
// it renamed into place, so that a reader sees the old file or the new.
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.Chmod(tmp, mode); err != nil { // the umask may have narrowed it
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
