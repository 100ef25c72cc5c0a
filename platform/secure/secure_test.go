package secure_test

import (
	"strings"
	"testing"

	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/secure"
)

// TestCheck: settings fit for production pass; each insecure setting is
// named, and only it.
func TestCheck(t *testing.T) {
	good := secure.Settings{
		NATS:    []secure.Login{{Flag: "--nats-user", User: "api-eu", Password: "s3cret-from-a-vault"}},
		NATSURL: "nats://nats-eu-1.internal:4222,nats://nats-eu-2.internal:4222", NATSCA: "/certs/ca.pem",
		PostgresURL: "postgres://paymesh:pw@db.internal:5432/paymesh_eu?sslmode=verify-full",
		HTTPListen:  "0.0.0.0:8080", TLSUpstream: true,
	}
	if got := secure.Check(good); len(got) != 0 {
		t.Fatalf("production settings: got %q, want nothing", got)
	}
	for name, mut := range map[string]func(*secure.Settings){
		"TLSURLs": func(s *secure.Settings) {
			s.NATSURL, s.NATSCA = "tls://nats-eu-1.internal:4222,tls://nats-eu-2.internal:4222", ""
		},
		"LoopbackNATS": func(s *secure.Settings) {
			s.NATSURL, s.NATSCA = "nats://127.0.0.1:4222,nats://localhost:4223,[::1]:4224", ""
		},
		"NoNATS": func(s *secure.Settings) { s.NATSURL, s.NATSCA = "", "" },
		// A highly available database: every node's address, the one that
		// takes writes chosen at each connection.
		"MultiHostPostgres": func(s *secure.Settings) {
			s.PostgresURL = "postgres://paymesh:pw@db-1.internal:5432,db-2.internal:5432/paymesh_eu?sslmode=verify-full&target_session_attrs=read-write"
		},
	} {
		s := good
		mut(&s)
		if got := secure.Check(s); len(got) != 0 {
			t.Errorf("%s: got %q, want nothing", name, got)
		}
	}
	for _, loop := range []string{"127.0.0.1:8080", "[::1]:8080", "localhost:8080"} {
		s := good
		s.HTTPListen, s.TLSUpstream = loop, false
		if got := secure.Check(s); len(got) != 0 {
			t.Errorf("plain HTTP on %s: got %q, want nothing (loopback)", loop, got)
		}
	}
	cases := map[string]struct {
		mut  func(*secure.Settings)
		want string
	}{
		"AnonymousNATS": {func(s *secure.Settings) { s.NATS[0].User, s.NATS[0].Password = "", "" }, "NATS without a user (--nats-user)"},
		"DevPassword":   {func(s *secure.Settings) { s.NATS[0].Password = natsauth.DevPassword("api-eu") }, "api-eu has its published development password"},
		"OpsDevPassword": {func(s *secure.Settings) {
			s.NATS = append(s.NATS, secure.Login{Flag: "--ops-nats-user", User: "ops-eu", Password: natsauth.DevPassword("ops-eu")})
		}, "ops-eu has its published development password (--ops-nats-user)"},
		"PlainNATS": {func(s *secure.Settings) {
			s.NATSURL, s.NATSCA = "tls://nats-eu-1.internal:4222,nats://nats-eu-2.internal:4222,127.0.0.1:4222", ""
		}, "NATS without TLS to nats-eu-2.internal:4222, an address other hosts can reach"},
		"PlainNATSNoScheme": {func(s *secure.Settings) { s.NATSURL, s.NATSCA = "nats-eu-3.internal:4222", "" }, "NATS without TLS to nats-eu-3.internal:4222"},
		"PostgresDevPassword": {func(s *secure.Settings) {
			s.PostgresURL = "postgres://postgres:dev-only-postgres-eu-not-a-secret@db.internal:5432/x?sslmode=verify-full"
		}, "Postgres user postgres has a published development password"},
		"SSLDisabled": {func(s *secure.Settings) { s.PostgresURL = "postgres://db/x?sslmode=disable" }, "without TLS"},
		"MultiHostPrefer": {func(s *secure.Settings) {
			s.PostgresURL = "postgres://db-1:5432,db-2:5432/x?sslmode=prefer&target_session_attrs=read-write"
		}, "without TLS"},
		"SSLPrefer":       {func(s *secure.Settings) { s.PostgresURL = "postgres://db/x?sslmode=prefer" }, "without TLS"},
		"SSLUnset":        {func(s *secure.Settings) { s.PostgresURL = "postgres://db/x" }, "without TLS"},
		"PostgresGarbage": {func(s *secure.Settings) { s.PostgresURL = "postgres://db:notaport/x" }, "does not parse"},
		"PlainHTTPAll":    {func(s *secure.Settings) { s.TLSUpstream = false }, "plain HTTP on 0.0.0.0:8080"},
		"PlainHTTPHost":   {func(s *secure.Settings) { s.HTTPListen, s.TLSUpstream = "api.example.com:80", false }, "plain HTTP on api.example.com:80"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := good
			s.NATS = append([]secure.Login(nil), good.NATS...)
			tc.mut(&s)
			got := secure.Check(s)
			if len(got) != 1 || !strings.Contains(got[0], tc.want) {
				t.Fatalf("got %q, want one finding saying %q", got, tc.want)
			}
		})
	}
}
