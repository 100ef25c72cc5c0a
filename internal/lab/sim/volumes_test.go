package sim

import "testing"

// TestMapPaths: a mount target is rewritten where a value starts and a
// path element ends, in arguments, URLs, lists and config lines, and
// nowhere else.
func TestMapPaths(t *testing.T) {
	m := map[string]string{"/certs": "/run/volumes/certs", "/certs/extra/": "/elsewhere", "/ca": "/run/volumes/ca"}
	cases := map[string]string{
		"/certs":             "/run/volumes/certs",
		"/certs/ca.pem":      "/run/volumes/certs/ca.pem",
		"/certs/extra/x.pem": "/elsewhere/x.pem",
		"postgres://u:p@h:1/db?sslmode=verify-full&sslrootcert=/certs/ca.pem": "postgres://u:p@h:1/db?sslmode=verify-full&sslrootcert=/run/volumes/certs/ca.pem",
		"eu=x?sslrootcert=/certs/ca.pem&a=b,us=y?sslrootcert=/certs/ca.pem":   "eu=x?sslrootcert=/run/volumes/certs/ca.pem&a=b,us=y?sslrootcert=/run/volumes/certs/ca.pem",
		"/certs,/ca":                        "/run/volumes/certs,/run/volumes/ca",
		`  cert_file: "/certs/nats-eu.pem"`: `  cert_file: "/run/volumes/certs/nats-eu.pem"`,
		"ssl_key_file=/certs/k.pem":         "ssl_key_file=/run/volumes/certs/k.pem",
		// Not a mount's path: left as it is.
		"/etc/certs/ca.pem": "/etc/certs/ca.pem",
		"/certs2/ca.pem":    "/certs2/ca.pem",
		"/cache":            "/cache",
		"x/certs/ca.pem":    "x/certs/ca.pem",
		"":                  "",
	}
	for in, want := range cases {
		if got := mapPaths(m, in); got != want {
			t.Errorf("mapPaths(%q) = %q, want %q", in, got, want)
		}
	}
	if got := mapPaths(nil, "/certs/ca.pem"); got != "/certs/ca.pem" {
		t.Errorf("no mounts: got %q", got)
	}
}
