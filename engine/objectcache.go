package engine

import (
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// WithObjectCache keeps the AST values of the objects decisions read (a pool plan's pool, VMs,
// VMIs and volumes), by UID and resourceVersion, for at most about 2n objects: an object the
// API server has not changed since the last decision is not converted again. A controller
// plans the same pools over and over from its informers' objects, most of them unchanged;
// converting a 1,000-VM pool's VMs and VMIs was a fifth to a third of each plan. Only objects
// as the API server stores them may be given to such an engine: one changed in memory without
// a new resourceVersion would be decided as it was. n < 1 keeps none (the default).
func WithObjectCache(n int) Option { return func(o *options) { o.objectCache = n } }

// objectCache holds converted objects in two generations: lookups find an object in the
// current one, or move it there from the previous one; once the current one holds limit
// objects it becomes the previous one, and what the previous one still held is dropped. So
// the objects decided on recently stay, at most 2×limit of them, without a sweep or a clock.
type objectCache struct {
	limit        int
	mu           sync.Mutex
	cur, prev    map[types.UID]cachedObject
	hits, misses atomic.Int64
}

type cachedObject struct {
	resourceVersion string
	term            *ast.Term
}

func newObjectCache(limit int) *objectCache {
	if limit < 1 {
		return nil
	}
	return &objectCache{limit: limit, cur: make(map[types.UID]cachedObject, limit)}
}

// get is u's value as converted before, if u is the same version of the same object.
func (c *objectCache) get(u *unstructured.Unstructured) (*ast.Term, bool) {
	uid, rv := u.GetUID(), u.GetResourceVersion()
	if uid == "" || rv == "" {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.cur[uid]
	if !ok {
		if e, ok = c.prev[uid]; ok && e.resourceVersion == rv {
			c.store(uid, e)
		}
	}
	if !ok || e.resourceVersion != rv {
		c.misses.Add(1)
		return nil, false
	}
	c.hits.Add(1)
	return e.term, true
}

// put keeps t as u's value.
func (c *objectCache) put(u *unstructured.Unstructured, t *ast.Term) {
	uid, rv := u.GetUID(), u.GetResourceVersion()
	if uid == "" || rv == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.store(uid, cachedObject{resourceVersion: rv, term: t})
}

func (c *objectCache) store(uid types.UID, e cachedObject) {
	if _, ok := c.cur[uid]; !ok && len(c.cur) >= c.limit {
		c.prev, c.cur = c.cur, make(map[types.UID]cachedObject, c.limit)
	}
	c.cur[uid] = e
}

// ObjectCacheStats are the lookups of WithObjectCache's cache since the engine started.
type ObjectCacheStats struct {
	// Hits are objects not converted again; Misses those converted (new, changed or dropped).
	Hits, Misses int64
}

// ObjectCacheStats counts the object cache's lookups; zero without WithObjectCache.
func (e *Engine) ObjectCacheStats() ObjectCacheStats {
	if e.objects == nil {
		return ObjectCacheStats{}
	}
	return ObjectCacheStats{Hits: e.objects.hits.Load(), Misses: e.objects.misses.Load()}
}
