package fakeengine

import (
	"container/list"
	"sync"
)

// prefixCache is a bounded LRU of prompt-block hashes, the fake's model of
// vLLM's automatic prefix caching: a prompt whose first k blocks are
// cached skips computing their tokens.
//
// A chain of blocks is touched tail first, so its head is the most recently
// used: eviction then takes the ends of prompts before their beginnings
// (vLLM frees a request's blocks in reverse order for the same reason), and
// a partly evicted prompt still hits on its remaining prefix.
type prefixCache struct {
	mu       sync.Mutex
	capacity int
	order    *list.List // of uint64, most recently used at the front
	at       map[uint64]*list.Element
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, order: list.New(), at: make(map[uint64]*list.Element)}
}

// match returns how many of the leading hashes are cached, at most limit,
// and marks those as just used.
func (c *prefixCache) match(hashes []uint64, limit int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for n < min(limit, len(hashes)) {
		if _, ok := c.at[hashes[n]]; !ok {
			break
		}
		n++
	}
	for i := n - 1; i >= 0; i-- {
		c.order.MoveToFront(c.at[hashes[i]])
	}
	return n
}

// insert caches hashes (a computed prompt's blocks), evicting the least
// recently used beyond capacity.
func (c *prefixCache) insert(hashes []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if e, ok := c.at[h]; ok {
			c.order.MoveToFront(e)
			continue
		}
		c.at[h] = c.order.PushFront(h)
	}
	for c.order.Len() > c.capacity {
		e := c.order.Back()
		delete(c.at, e.Value.(uint64))
		c.order.Remove(e)
	}
}

// reset empties the cache.
func (c *prefixCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	clear(c.at)
}

// len is how many blocks are cached.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
