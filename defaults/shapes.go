package defaults

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/virt-rules/virt-rules/engine"
)

// Epocher is a Hypervisor whose answers hold for an epoch (a Cache's): what was derived from
// them is kept only as long as the epoch lasts.
type Epocher interface {
	Epoch(ctx context.Context) uint64
}

// ShapeCache remembers the defaults of objects by their shape, so that objects of one
// template (each with its own name, disks and cloud-init data) are planned, defined and
// mapped once.
//
// The rules decide what a shape is (vm.defaults.shape): the spec as far as they read it, and
// the defaults an object's identity (namespace, name, generateName, the request creating it)
// gives, its firmware UUID and MACs. Their promise: objects of one kind, machine types and
// shape get the same defaults but those. So an object's defaults are those of an earlier
// object of its shape, from the same bundle activation and libvirt epoch, with its own
// identity defaults put in their places. A bundle without that rule is evaluated in full for
// every object.
//
// An answer is kept only when each identity default is in it, at its path with its value, and
// no other value in it holds an identity value: what the rules say is checked, not assumed.
// Errors are never kept. On a hit the rules run only for the shape; the decision log then
// shows that decision alone.
type ShapeCache struct {
	mu     sync.Mutex
	shapes *lru[shapeKey, *shapeEntry]

	metrics *ShapeCacheMetrics
}

type shapeKey [sha256.Size]byte

type shapeEntry struct {
	revision string
	defaults []engine.VMDefault
	// warnings are what the rules leave to the node; they depend on the shape alone.
	warnings []engine.FieldError
	// identity[i] is where the i-th identity default is in defaults.
	identity []int
}

// ShapeCacheMetrics are a ShapeCache's Prometheus metrics.
type ShapeCacheMetrics struct {
	requests *prometheus.CounterVec
	entries  prometheus.Gauge
}

// NewShapeCacheMetrics makes a set of shape cache metrics, to be registered once.
func NewShapeCacheMetrics() *ShapeCacheMetrics {
	return &ShapeCacheMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "virtrules_defaults_shape_cache_requests_total",
			Help: "Objects asked of the shape cache, by result: hit (only the shape decision evaluated), miss (evaluated in full, answer kept), bypass (evaluated in full, answer not kept).",
		}, []string{"result"}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "virtrules_defaults_shape_cache_entries",
			Help: "Shapes whose defaults the shape cache keeps.",
		}),
	}
}

// Collectors are the metrics, to register.
func (m *ShapeCacheMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.entries}
}

// NewShapeCache keeps the defaults of up to size shapes (least recently used ones go first),
// counting in metrics (nil: metrics of its own, unregistered).
func NewShapeCache(size int, metrics *ShapeCacheMetrics) (*ShapeCache, error) {
	if size < 1 {
		return nil, fmt.Errorf("shape cache: size %d: want at least 1", size)
	}
	if metrics == nil {
		metrics = NewShapeCacheMetrics()
	}
	metrics.entries.Set(0)
	return &ShapeCache{shapes: newLRU[shapeKey, *shapeEntry](size), metrics: metrics}, nil
}

// Len is the number of shapes kept.
func (c *ShapeCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shapes.len()
}

// keyOf is the shape of an object: what its defaults depend on besides its identity.
func keyOf(digest, cluster [sha256.Size]byte, generation, epoch uint64, kind string, machines engine.Machines) shapeKey {
	h := sha256.New()
	h.Write(digest[:])
	h.Write(cluster[:])
	var n [16]byte
	binary.BigEndian.PutUint64(n[:8], generation)
	binary.BigEndian.PutUint64(n[8:], epoch)
	h.Write(n[:])
	fmt.Fprintf(h, "%s\x00", kind)
	for _, arch := range slices.Sorted(maps.Keys(machines)) {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00", arch, len(machines[arch]), strings.Join(machines[arch], "\x00"))
	}
	var k shapeKey
	h.Sum(k[:0])
	return k
}

// get is the kept answer for key with ids, the object's own identity defaults, in their
// places, its warnings and the revision that answered; ok is false when none is kept for
// these ids.
func (c *ShapeCache) get(key shapeKey, ids []engine.VMDefault) (defs []engine.VMDefault, warnings []engine.FieldError, revision string, ok bool) {
	c.mu.Lock()
	e, found := c.shapes.get(key)
	c.mu.Unlock()
	if !found {
		return nil, nil, "", false
	}
	if len(e.identity) != len(ids) {
		return nil, nil, "", false
	}
	for i, j := range e.identity {
		if !slices.Equal(e.defaults[j].Path, ids[i].Path) {
			return nil, nil, "", false
		}
	}
	defs = make([]engine.VMDefault, len(e.defaults))
	for j, d := range e.defaults {
		defs[j] = engine.VMDefault{Path: d.Path, Value: deepCopy(d.Value)}
	}
	for i, j := range e.identity {
		defs[j].Value = ids[i].Value
	}
	c.metrics.requests.WithLabelValues(cacheHit).Inc()
	return defs, slices.Clone(e.warnings), e.revision, true
}

// put keeps defs and warnings, the full answer for an object of shape key whose identity
// defaults are ids, when it keeps the rules' promise; it tells whether it did.
func (c *ShapeCache) put(key shapeKey, revision string, defs []engine.VMDefault, warnings []engine.FieldError, ids []engine.VMDefault) bool {
	identity, ok := identitySlots(defs, ids)
	if !ok {
		c.metrics.requests.WithLabelValues(cacheBypass).Inc()
		return false
	}
	kept := make([]engine.VMDefault, len(defs))
	for j, d := range defs {
		kept[j] = engine.VMDefault{Path: d.Path, Value: deepCopy(d.Value)}
	}
	for _, j := range identity {
		kept[j].Value = nil // the object's own; put in on every hit
	}
	c.metrics.requests.WithLabelValues(cacheMiss).Inc()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shapes.put(key, &shapeEntry{revision: revision, defaults: kept, warnings: slices.Clone(warnings), identity: identity})
	c.metrics.entries.Set(float64(c.shapes.len()))
	return true
}

// bypass counts an object the cache could not serve nor learn from.
func (c *ShapeCache) bypass() { c.metrics.requests.WithLabelValues(cacheBypass).Inc() }

// identitySlots finds each identity default in defs, at its path with its value; ok is false
// when one is missing or when any other default holds an identity value (then the answer
// depends on the identity in a way the cache cannot put right).
func identitySlots(defs, ids []engine.VMDefault) (slots []int, ok bool) {
	slots = make([]int, len(ids))
	values := make([]string, 0, len(ids))
	for i, id := range ids {
		j := slices.IndexFunc(defs, func(d engine.VMDefault) bool { return slices.Equal(d.Path, id.Path) })
		if j < 0 || slices.Contains(slots[:i], j) || !reflect.DeepEqual(defs[j].Value, id.Value) {
			return nil, false
		}
		slots[i] = j
		s, isString := id.Value.(string)
		if !isString || s == "" {
			return nil, false
		}
		values = append(values, s)
	}
	for j, d := range defs {
		if !slices.Contains(slots, j) && holdsAny(d.Value, values) {
			return nil, false
		}
	}
	return slots, true
}

// holdsAny tells whether v, or anything in it, is a string containing one of values.
func holdsAny(v any, values []string) bool {
	switch x := v.(type) {
	case string:
		return slices.ContainsFunc(values, func(s string) bool { return strings.Contains(x, s) })
	case []any:
		return slices.ContainsFunc(x, func(e any) bool { return holdsAny(e, values) })
	case map[string]any:
		for k, e := range x {
			if holdsAny(k, values) || holdsAny(e, values) {
				return true
			}
		}
	}
	return false
}

// deepCopy copies the lists and objects of a JSON value, so that no two objects share them.
func deepCopy(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	}
	return v
}
