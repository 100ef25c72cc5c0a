package apidb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
)

// TestKeyRotation: a client holds several keys at once, so a rotation
// overlaps; a revoked or expired key authenticates nobody, while the
// others go on; registering the client again replaces all its keys; bad
// input (an unknown client or key, an expiry in the past) is refused with
// its error and changes nothing.
func TestKeyRotation(t *testing.T) {
	_, store := fixture(t)
	ctx := context.Background()
	who := func(key string) string {
		t.Helper()
		c, ok, err := store.ClientByKey(ctx, api.HashKey(key))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ""
		}
		return c.ID
	}
	if err := store.PutClient(ctx, api.RegisteredClient{ID: "acme"}, "key-one-0123456789"); err != nil {
		t.Fatal(err)
	}
	two, err := store.AddKey(ctx, "acme", "key-two-0123456789", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	soon, err := store.AddKey(ctx, "acme", "key-soon-0123456789", time.Now().Add(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"key-one-0123456789", "key-two-0123456789", "key-soon-0123456789"} {
		if got := who(k); got != "acme" {
			t.Fatalf("%s during the rotation: client %q, want acme", k, got)
		}
	}
	keys, err := store.Keys(ctx, "acme")
	if err != nil || len(keys) != 3 || keys[1].ID != two.ID || keys[2].ExpiresAt.IsZero() || !keys[0].Valid(time.Now()) {
		t.Fatalf("keys: %+v %v, want three, the last with its expiry", keys, err)
	}
	if err := store.RevokeKey(ctx, "acme", keys[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := who("key-one-0123456789"); got != "" {
		t.Errorf("the revoked key authenticates %q", got)
	}
	if got := who("key-two-0123456789"); got != "acme" {
		t.Errorf("the new key after the revocation: %q, want acme", got)
	}
	for deadline := time.Now().Add(10 * time.Second); who("key-soon-0123456789") != ""; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the key past its expiry (%s) still authenticates", soon.ExpiresAt)
		}
	}

	// Bad input.
	if _, err := store.AddKey(ctx, "nobody", "key-x-0123456789", time.Time{}); !errors.Is(err, apidb.ErrNoClient) {
		t.Errorf("a key for an unknown client: %v, want ErrNoClient", err)
	}
	if _, err := store.AddKey(ctx, "acme", "key-late-0123456789", time.Now().Add(-time.Minute)); err == nil {
		t.Error("a key that expired already: no error")
	}
	if err := store.RevokeKey(ctx, "acme", "ffffffff"); !errors.Is(err, apidb.ErrNoKey) {
		t.Errorf("revoke an unknown key: %v, want ErrNoKey", err)
	}
	if keys, _ := store.Keys(ctx, "acme"); len(keys) != 3 {
		t.Errorf("keys after the bad input: %d, want 3", len(keys))
	}

	// Registering again replaces them all.
	if err := store.PutClient(ctx, api.RegisteredClient{ID: "acme"}, "key-fresh-0123456789"); err != nil {
		t.Fatal(err)
	}
	if got, fresh := who("key-two-0123456789"), who("key-fresh-0123456789"); got != "" || fresh != "acme" {
		t.Errorf("after registering again: the old key is %q, the new one %q; want only the new", got, fresh)
	}
}
