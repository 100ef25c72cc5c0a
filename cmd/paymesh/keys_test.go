package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
)

// migratedEU creates and migrates region eu's database <prefix>eu for
// the test, and returns its API store.
func migratedEU(t *testing.T, tab regions.Table, prefix string) *apidb.Store {
	t.Helper()
	ctx := context.Background()
	db := prefix + "eu"
	url, err := pgdb.Create(ctx, pgtest.AdminURL(), db, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pgdb.Drop(context.Background(), pgtest.AdminURL(), db) })
	if err := (&migrateCmd{regionDB: regionDB{Region: "eu", PostgresURL: pgtest.AdminURL(), Database: db}, WindowDays: 7}).Run(ctx, tab); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return apidb.New(pool)
}

// stdout runs f and returns what it printed.
func stdout(t *testing.T, f func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	err = f()
	os.Stdout = saved
	w.Close()
	out, _ := io.ReadAll(r)
	return string(out), err
}

// TestClientKeys: `paymesh client acme` registers a client with a key the
// server makes; `client rotate` gives it a second key while the first
// still works; `client revoke` ends the first; `client list` shows both
// by id, never the keys. A key chosen by hand (--key) is refused outside
// development, and so are an unknown key id and a negative expiry.
func TestClientKeys(t *testing.T) {
	ctx := context.Background()
	tab, ids := defaultRegions(t)
	prefix := fmt.Sprintf("pmtest_clientkeys_%d_", os.Getpid())
	eu := migratedEU(t, tab, prefix)
	holder := func(key string) string {
		c, ok, err := eu.ClientByKey(ctx, api.HashKey(key))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ""
		}
		return c.ID
	}
	where := []string{"--region", "eu", "--postgres-url", pgtest.AdminURL(), "--database-prefix", prefix}
	cmd := func(args ...string) *cli { return parse(t, append(append([]string{"client"}, args...), where...)...) }

	first, err := stdout(t, func() error { return cmd("acme").Client.Add.Run(ctx, tab, ids, discard) })
	first = strings.TrimSpace(first)
	if err != nil || !strings.HasPrefix(first, "pm_") || len(first) < 3+32 || holder(first) != "acme" {
		t.Fatalf("client acme: printed %q (%v), want a key of at least 128 bits that authenticates acme", first, err)
	}
	out, err := stdout(t, func() error { return cmd("rotate", "acme", "--expires-in", "1h").Client.Rotate.Run(ctx, tab, discard) })
	second, _, _ := strings.Cut(strings.TrimSpace(out), "\t")
	if err != nil || second == first || holder(second) != "acme" || holder(first) != "acme" {
		t.Fatalf("client rotate: printed %q (%v); want a new key, with the first still working", out, err)
	}
	keys, err := eu.Keys(ctx, "acme")
	if err != nil || len(keys) != 2 || keys[1].ExpiresAt.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("keys after the rotation: %+v %v, want two, the second expiring in an hour", keys, err)
	}
	if err := cmd("revoke", "acme", keys[0].ID).Client.Revoke.Run(ctx, tab, discard); err != nil {
		t.Fatal(err)
	}
	if holder(first) != "" || holder(second) != "acme" {
		t.Fatalf("after revoking %s: the first key authenticates %q, the second %q; want only the second", keys[0].ID, holder(first), holder(second))
	}
	listed, err := stdout(t, func() error { return cmd("list", "acme").Client.List.Run(ctx, tab, discard) })
	if err != nil || !strings.Contains(listed, keys[0].ID) || !strings.Contains(listed, "revoked") || !strings.Contains(listed, "valid until") ||
		strings.Contains(listed, first) || strings.Contains(listed, second) {
		t.Fatalf("client list: %q (%v), want both ids, one revoked and one valid until its expiry, and no key", listed, err)
	}

	// Bad input.
	if err := cmd("acme", "--key", "chosen-by-hand-0123").Client.Add.Run(ctx, tab, ids, discard); err == nil || !strings.Contains(err.Error(), "--insecure-dev") {
		t.Errorf("--key without --insecure-dev: %v, want a refusal naming it", err)
	}
	if err := cmd("revoke", "acme", "ffffffff").Client.Revoke.Run(ctx, tab, discard); err == nil || !strings.Contains(err.Error(), "no key ffffffff") {
		t.Errorf("revoke an unknown key: %v, want an error naming it", err)
	}
	if err := cmd("rotate", "nobody").Client.Rotate.Run(ctx, tab, discard); err == nil || !strings.Contains(err.Error(), "no such client") {
		t.Errorf("rotate an unknown client: %v, want an error naming it", err)
	}
	if err := cmd("rotate", "acme", "--expires-in=-1h").Client.Rotate.Run(ctx, tab, discard); err == nil || !strings.Contains(err.Error(), "--expires-in") {
		t.Errorf("a negative expiry: %v, want an error naming the flag", err)
	}
	if keys, _ := eu.Keys(ctx, "acme"); len(keys) != 2 {
		t.Errorf("keys after the bad input: %d, want 2", len(keys))
	}
}
