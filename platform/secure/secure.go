// Package secure tells what in a service's settings is insecure: a NATS
// login without a user, a NATS user with its published development
// password, NATS without TLS to a server other hosts can reach, a Postgres
// connection that may run without TLS or logs in with a published
// development password, and plain HTTP on an address other hosts can
// reach. paymesh's services refuse to start
// with any of them unless started for development (--insecure-dev), which
// logs each as a warning instead (cmd/paymesh).
package secure

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paymesh/paymesh/platform/natsauth"
)

// Settings are what a service connects and listens with.
type Settings struct {
	// NATS are the logins it connects to NATS with.
	NATS []Login
	// NATSURL is its NATS servers (one URL or a comma-separated list), and
	// NATSCA the authority it verifies them with ("" for none: then only a
	// tls:// URL requires TLS).
	NATSURL, NATSCA string
	// PostgresURL is its database.
	PostgresURL string
	// HTTPListen is the address it serves its API on; "" for none.
	HTTPListen string
	// TLSUpstream says that TLS ends in front of HTTPListen (a proxy or a
	// load balancer), so plain HTTP there is no exposure.
	TLSUpstream bool
}

// Login is a NATS user and its password.
type Login struct {
	// Flag names the setting, for the message ("--nats-user").
	Flag           string
	User, Password string
}

// Check returns what is insecure in s, each a sentence naming the setting;
// none for settings fit for production.
func Check(s Settings) []string {
	var out []string
	for _, l := range s.NATS {
		switch {
		case l.User == "":
			out = append(out, fmt.Sprintf("NATS without a user (%s): any client of the server acts as this service", l.Flag))
		case l.Password == natsauth.DevPassword(l.User) || IsDevPassword(l.Password):
			out = append(out, fmt.Sprintf("NATS user %s has its published development password (%s)", l.User, l.Flag))
		}
	}
	if why := natsInsecure(s.NATSURL, s.NATSCA); why != "" {
		out = append(out, why)
	}
	out = append(out, postgresInsecure(s.PostgresURL)...)
	if s.HTTPListen != "" && !s.TLSUpstream && !loopback(s.HTTPListen) {
		out = append(out, fmt.Sprintf("plain HTTP on %s, an address other hosts can reach (serve it behind TLS and say so with --tls-upstream)", s.HTTPListen))
	}
	return out
}

// IsDevPassword reports whether pw is one of the published development
// passwords of docker-compose.yml and the nats configs
// ("dev-only-<name>-not-a-secret").
func IsDevPassword(pw string) bool {
	return strings.HasPrefix(pw, "dev-only-") && strings.HasSuffix(pw, "-not-a-secret")
}

// natsInsecure says why urls may reach a server other hosts can reach
// without TLS, or "" when every server is on loopback or every connection
// requires TLS (an authority to verify with, or tls:// URLs).
func natsInsecure(urls, ca string) string {
	if ca != "" || urls == "" {
		return ""
	}
	var plain []string
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			u, err = url.Parse("nats://" + raw) // host:port without a scheme
		}
		if err != nil {
			plain = append(plain, raw)
			continue
		}
		if u.Scheme == "tls" || loopbackHost(u.Hostname()) {
			continue
		}
		plain = append(plain, u.Host)
	}
	if len(plain) == 0 {
		return ""
	}
	return fmt.Sprintf("NATS without TLS to %s, an address other hosts can reach (--nats-url with tls:// URLs, or --nats-ca with the servers' authority)", strings.Join(plain, ", "))
}

// postgresInsecure says why url may connect without TLS, or logs in with
// a published development password; nothing when every connection it
// makes uses TLS (sslmode require, verify-ca or verify-full) with a
// password of its own.
func postgresInsecure(url string) []string {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return []string{fmt.Sprintf("a Postgres URL that does not parse (%v)", err)}
	}
	var out []string
	plain := cfg.TLSConfig == nil
	for _, f := range cfg.Fallbacks {
		plain = plain || f.TLSConfig == nil
	}
	if plain {
		out = append(out, "a Postgres URL that allows a connection without TLS (sslmode is disable, allow, prefer or unset; want require, verify-ca or verify-full)")
	}
	if IsDevPassword(cfg.Password) {
		out = append(out, fmt.Sprintf("Postgres user %s has a published development password", cfg.User))
	}
	return out
}

// loopback reports whether addr (host:port) listens on this host only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && loopbackHost(host)
}

// loopbackHost reports whether host names this host only.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
