package defaults

import "container/list"

// lru keeps up to size values by key; the least recently used goes first. Its owner locks.
type lru[K comparable, V any] struct {
	size    int
	entries map[K]*list.Element
	order   *list.List // front: most recently used
}

type lruEntry[K comparable, V any] struct {
	key   K
	value V
}

func newLRU[K comparable, V any](size int) *lru[K, V] {
	return &lru[K, V]{size: size, entries: map[K]*list.Element{}, order: list.New()}
}

// get is the value kept for key, now the most recently used.
func (c *lru[K, V]) get(key K) (V, bool) {
	el, found := c.entries[key]
	if !found {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*lruEntry[K, V]).value, true
}

// put keeps value for key, replacing what was kept for it, and lets the least recently used
// values go beyond size.
func (c *lru[K, V]) put(key K, value V) {
	if el, found := c.entries[key]; found {
		c.order.Remove(el)
	}
	c.entries[key] = c.order.PushFront(&lruEntry[K, V]{key: key, value: value})
	for c.order.Len() > c.size {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(*lruEntry[K, V]).key)
	}
}

func (c *lru[K, V]) len() int { return c.order.Len() }

func (c *lru[K, V]) clear() {
	clear(c.entries)
	c.order.Init()
}
