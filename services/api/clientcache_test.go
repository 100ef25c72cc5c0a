package api

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"
)

// TestClientCacheBounded: the cache never holds more than its maximum, an
// entry is kept until its TTL ends and not after, and a cache with no TTL
// keeps nothing.
func TestClientCacheBounded(t *testing.T) {
	c := clientCache{ttl: time.Second, max: 100}
	now := time.Now()
	for i := range 1000 {
		c.put(sha256.Sum256(fmt.Append(nil, i)), RegisteredClient{ID: fmt.Sprint("c", i)}, now)
		if n := c.len(); n > 100 {
			t.Fatalf("after %d clients the cache holds %d, want at most 100", i+1, n)
		}
	}
	last := sha256.Sum256(fmt.Append(nil, 999))
	if got, ok := c.get(last, now.Add(999*time.Millisecond)); !ok || got.ID != "c999" {
		t.Fatalf("within the TTL: got %+v %v, want c999", got, ok)
	}
	if got, ok := c.get(last, now.Add(time.Second)); ok {
		t.Fatalf("at the TTL's end: got %+v, want nothing", got)
	}
	off := clientCache{ttl: -1, max: 100}
	off.put(last, RegisteredClient{ID: "x"}, now)
	if _, ok := off.get(last, now); ok || off.len() != 0 {
		t.Fatal("a cache without a TTL kept a client")
	}
}
