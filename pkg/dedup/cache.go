package dedup

import (
	"sync"
	"time"
)

// Cache is a bounded set of recently committed keys, evicted first-in
// first-out. It only ever answers "known duplicate"; a miss says nothing, and
// every miss goes to the consume-log table. It is safe for concurrent use.
type Cache struct {
	mu   sync.Mutex
	ring []string
	next int
	m    map[string]cached
}

// cached is what the cache keeps of a committed key: its fingerprint and
// when it was claimed.
type cached struct {
	fp []byte
	at time.Time
}

// NewCache returns a cache holding at most size keys. A size below 1 is
// treated as 1.
func NewCache(size int) *Cache {
	size = max(size, 1)
	return &Cache{ring: make([]string, size), m: make(map[string]cached, size)}
}

// Len returns how many keys the cache holds.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func cacheKey(consumer, id string) string { return consumer + "\x00" + id }

func (c *Cache) get(consumer, id string) (cached, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[cacheKey(consumer, id)]
	return e, ok
}

func (c *Cache) put(consumer, id string, fp []byte, at time.Time) {
	k := cacheKey(consumer, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return
	}
	if old := c.ring[c.next]; old != "" {
		delete(c.m, old)
	}
	c.ring[c.next] = k
	c.m[k] = cached{fp: fp, at: at}
	c.next = (c.next + 1) % len(c.ring)
}
