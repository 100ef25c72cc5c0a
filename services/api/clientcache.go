package api

import (
	"crypto/sha256"
	"sync"
	"time"
)

// clientCache keeps the clients found by their API key for a short TTL, so
// that a request does not read its client from the database each time. A
// revoked key (its client's key replaced, or the client removed) keeps
// working until its entry's TTL ends, and no longer. Only keys that were
// found are kept: an unknown key is read from the database every time (so
// a key registered after a refused attempt works at once), and spraying
// keys cannot grow the cache. It holds at most max entries: when it is
// full, expired entries go first, then an arbitrary one.
//
// Its clock is the process's monotonic one, not Config.Now (which the
// idempotency keys' retention is measured by and tests step).
type clientCache struct {
	ttl time.Duration
	max int
	mu  sync.Mutex
	m   map[[sha256.Size]byte]cachedClient
}

type cachedClient struct {
	c     RegisteredClient
	until time.Time
}

// defaultClientCacheTTL is Config.ClientCacheTTL's default, and
// defaultClientCacheMax the most clients kept.
const (
	defaultClientCacheTTL = 2 * time.Second
	defaultClientCacheMax = 10_000
)

// get returns the client of the key hashing to hash if it is cached and
// its TTL has not ended at now.
func (c *clientCache) get(hash [sha256.Size]byte, now time.Time) (RegisteredClient, bool) {
	if c.ttl <= 0 {
		return RegisteredClient{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[hash]
	if !ok || !now.Before(e.until) {
		return RegisteredClient{}, false
	}
	return e.c, true
}

// put keeps client, found at now by the key hashing to hash, until now+ttl.
func (c *clientCache) put(hash [sha256.Size]byte, client RegisteredClient, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[[sha256.Size]byte]cachedClient{}
	}
	if _, ok := c.m[hash]; !ok && len(c.m) >= c.max {
		for h, e := range c.m {
			if !now.Before(e.until) {
				delete(c.m, h)
			}
		}
		for h := range c.m {
			if len(c.m) < c.max {
				break
			}
			delete(c.m, h)
		}
	}
	c.m[hash] = cachedClient{c: client, until: now.Add(c.ttl)}
}

// len returns how many clients are cached, expired ones included.
func (c *clientCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
