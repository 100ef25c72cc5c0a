package main

import (
	"slices"
	"testing"
)

// TestPostgresURLsList: --postgres-urls (PAYMESH_POSTGRES_URLS) is a list
// of region=URL, comma-separated or the flag repeated, whose URLs keep
// every host of a multi-host URL (docker-compose's, which lists a
// region's formation nodes): a list split on every comma would cut
// them after their first host.
func TestPostgresURLsList(t *testing.T) {
	const (
		eu = "postgres://postgres:pw@postgres-eu-1:5432,postgres-eu-2:5432/postgres?sslmode=verify-full&sslrootcert=/certs/ca.pem&target_session_attrs=read-write"
		us = "postgres://postgres:pw@postgres-us-1:5432,postgres-us-2:5432/postgres?sslmode=verify-full"
		ap = "postgres://postgres:pw@postgres-ap:5432/postgres?sslmode=verify-full"
	)
	want := []string{"eu=" + eu, "us=" + us, "ap=" + ap}
	t.Setenv("PAYMESH_POSTGRES_URLS", "eu="+eu+",us="+us+",ap="+ap)
	if got := regionURLs(parse(t, "client", "acme").Client.Add.URLs); !slices.Equal(got, want) {
		t.Errorf("PAYMESH_POSTGRES_URLS: got %q, want %q", got, want)
	}
	t.Setenv("PAYMESH_POSTGRES_URLS", "")
	if got := regionURLs(parse(t, "client", "acme", "--postgres-urls", "eu="+eu+",us="+us, "--postgres-urls", "ap="+ap).Client.Add.URLs); !slices.Equal(got, want) {
		t.Errorf("--postgres-urls: got %q, want %q", got, want)
	}
	if got := regionURLs(nil); len(got) != 0 {
		t.Errorf("no list: got %q", got)
	}
}
