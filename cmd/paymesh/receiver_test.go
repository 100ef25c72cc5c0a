package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReceiverRefuses: paymesh receiver refuses, before it connects to
// anything, a missing secret (no flag, an empty or missing secret file), a string that is not a signing secret, and a
// plain-HTTP listener on a public address without --insecure-dev.
func TestReceiverRefuses(t *testing.T) {
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		db     = "postgres://postgres@127.0.0.1:1/receiver?sslmode=require"
	)
	dir := t.TempDir()
	empty, bad := filepath.Join(dir, "empty"), filepath.Join(dir, "bad")
	if err := os.WriteFile(empty, []byte("\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(secret+"\nhunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--postgres-url", db}, "a signing secret is required"},
		{[]string{"--postgres-url", db, "--secret-file", empty}, "a signing secret is required"},
		{[]string{"--postgres-url", db, "--secret-file", filepath.Join(dir, "none")}, "--secret-file: open"},
		{[]string{"--postgres-url", db, "--secret-file", bad}, "not a signing secret"},
		{[]string{"--postgres-url", db, "--secret", "hunter2"}, "not a signing secret"},
		{[]string{"--postgres-url", db, "--secret", secret + ",whsec_"}, "not a signing secret"},
		{[]string{"--postgres-url", db, "--secret", secret, "--listen", "0.0.0.0:0"}, "refusing to start with insecure settings"},
	} {
		_, err := runCLI(t, append([]string{"receiver", "--connect-timeout", "0s"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("paymesh receiver %v: %v, want an error with %q", c.args, err, c.want)
		}
	}
}
