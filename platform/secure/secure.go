// Package secure tells what in a service's settings is insecure: a NATS
// login without a user, a NATS user with its published development
// password, a Postgres connection that may run without TLS, and plain HTTP
// on an address other hosts can reach. paymesh's services refuse to start
// with any of them unless started for development (--insecure-dev), which
// logs each as a warning instead (cmd/paymesh).
package secure

import (
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paymesh/paymesh/platform/natsauth"
)

// Settings are what a service connects and listens with.
type Settings struct {
	// NATS are the logins it connects to NATS with.
	NATS []Login
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
		case l.Password == natsauth.DevPassword(l.User):
			out = append(out, fmt.Sprintf("NATS user %s has its published development password (%s)", l.User, l.Flag))
		}
	}
	if why := postgresInsecure(s.PostgresURL); why != "" {
		out = append(out, why)
	}
	if s.HTTPListen != "" && !s.TLSUpstream && !loopback(s.HTTPListen) {
		out = append(out, fmt.Sprintf("plain HTTP on %s, an address other hosts can reach (serve it behind TLS and say so with --tls-upstream)", s.HTTPListen))
	}
	return out
}

// postgresInsecure says why url may connect without TLS, or "" when every
// connection it makes uses TLS (sslmode require, verify-ca or verify-full).
func postgresInsecure(url string) string {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return fmt.Sprintf("a Postgres URL that does not parse (%v)", err)
	}
	plain := cfg.TLSConfig == nil
	for _, f := range cfg.Fallbacks {
		plain = plain || f.TLSConfig == nil
	}
	if plain {
		return "a Postgres URL that allows a connection without TLS (sslmode is disable, allow, prefer or unset; want require, verify-ca or verify-full)"
	}
	return ""
}

// loopback reports whether addr (host:port) listens on this host only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
