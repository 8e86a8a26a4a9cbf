package share

import (
	"context"
	"sync"
	"time"
)

// Cache is a Source that keeps another Source's inventory between reads.
// The share loop reads its inventory every window and the metrics at
// every collection, while the manager's changes only when the manager
// says so: reading it decodes every record. Whoever hears of a change
// calls Invalidate; an inventory older than maxAge is read again anyway,
// in case a change went unannounced. Safe for concurrent use.
type Cache struct {
	src    Source
	maxAge time.Duration

	mu    sync.Mutex
	inv   Inventory
	at    time.Time
	valid bool
	gen   uint64 // counts Invalidate calls
}

// NewCache returns a Cache over src that keeps an inventory at most maxAge.
func NewCache(src Source, maxAge time.Duration) *Cache {
	return &Cache{src: src, maxAge: maxAge}
}

// Invalidate drops the cached inventory: the next read asks the source.
func (c *Cache) Invalidate() {
	c.mu.Lock()
	c.valid = false
	c.gen++
	c.mu.Unlock()
}

// Inventory returns the cached inventory, or reads the source's when there
// is none, it is older than maxAge, or it was invalidated. A read errs as
// the source did, and its error is not cached.
func (c *Cache) Inventory(ctx context.Context) (Inventory, error) {
	c.mu.Lock()
	if c.valid && time.Since(c.at) < c.maxAge {
		inv := c.inv
		c.mu.Unlock()
		return inv, nil
	}
	gen := c.gen
	c.mu.Unlock()
	inv, err := c.src.Inventory(ctx)
	if err != nil {
		return inv, err
	}
	c.mu.Lock()
	// An Invalidate while reading means the read may be stale: it is
	// returned, but the next read asks again.
	if c.gen == gen {
		c.inv, c.at, c.valid = inv, time.Now(), true
	}
	c.mu.Unlock()
	return inv, nil
}
