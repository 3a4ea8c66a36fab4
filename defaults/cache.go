package defaults

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/engine"
)

// DefaultCacheSize is how many libvirt answers a Service keeps unless told otherwise.
const DefaultCacheSize = 1024

// CapabilitiesCheckInterval is how often a Cache asks its hypervisor whether its capabilities
// changed (a QEMU upgraded under a running service), at most.
const CapabilitiesCheckInterval = 10 * time.Second

// Fingerprinter is a Hypervisor that can tell what its answers depend on besides the domain:
// a digest of its capabilities (QEMU's version, machine types, CPU models). A Cache empties
// itself when it changes.
type Fingerprinter interface {
	CapabilitiesDigest(ctx context.Context) (string, error)
}

// Cache is a Hypervisor that remembers libvirt's answers, so that VMs of one shape (many VMs
// of one template) are defined once. An answer is keyed by the domain XML sent to libvirt with
// what is the VM's own identity rather than libvirt's choice normalized: the name and UUID
// (per request anyway) and the interfaces' MAC addresses (derived from each VM). libvirt
// assigns PCI addresses, models and controllers from the devices' kinds and order, never from
// a MAC or UUID (test/defaults checks cached answers against fresh ones over varied VMs), so a
// cached answer with this request's MACs put back is the answer libvirt gives.
//
// MACs are normalized to their equality class (the first distinct MAC, the second, ...) and
// their first octet, which holds the multicast and locally-administered bits libvirt checks.
// A domain with an interface without a MAC, or one not in canonical form, is not cached: libvirt
// would pick or reformat it. An answer is cached only if every MAC in it is one the request
// sent; refusals and errors are never cached. The name and UUID in a cached answer are those
// of the request that filled the cache (both are backend-only).
//
// Bundle revisions do not matter: the key is the whole domain the bundle planned. Capabilities
// do: the Cache empties itself when the hypervisor's digest changes (checked at most every
// CapabilitiesCheckInterval) and belongs to one hypervisor.
type Cache struct {
	inner Hypervisor

	mu      sync.Mutex
	answers *lru[string, []byte] // libvirt's XML by cacheKey, MACs replaced by macToken(i)

	fp        Fingerprinter
	checkMu   sync.Mutex
	digest    string
	checkedAt time.Time
	now       func() time.Time

	metrics *CacheMetrics

	// epoch changes whenever the cache empties itself (see Epoch).
	epoch atomic.Uint64
}

// cacheEpochs numbers the epochs of every cache in the process, so that no two are equal.
var cacheEpochs atomic.Uint64

// CacheMetrics are a Cache's Prometheus metrics; one set may serve successive caches (a
// Service's, across SetHypervisor calls).
type CacheMetrics struct {
	requests *prometheus.CounterVec
	entries  prometheus.Gauge
	flushes  prometheus.Counter
}

// NewCacheMetrics makes a set of cache metrics, to be registered once.
func NewCacheMetrics() *CacheMetrics {
	m := &CacheMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "virtrules_defaults_libvirt_cache_requests_total",
			Help: "Domains asked of the libvirt answer cache, by result: hit (libvirt skipped), miss (libvirt asked, answer kept), bypass (libvirt asked, answer not cacheable).",
		}, []string{"result"}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "virtrules_defaults_libvirt_cache_entries",
			Help: "libvirt answers kept in the cache.",
		}),
		flushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "virtrules_defaults_libvirt_cache_flushes_total",
			Help: "Times the libvirt answer cache was emptied because libvirt's capabilities changed.",
		}),
	}
	for _, r := range []string{cacheHit, cacheMiss, cacheBypass} {
		m.requests.WithLabelValues(r)
	}
	return m
}

// Collectors are the metrics, to register.
func (m *CacheMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.entries, m.flushes}
}

// Cache results: a hit skipped libvirt; a miss asked it and stored the answer; a bypass asked
// it without caching (a domain or answer the cache cannot normalize).
const (
	cacheHit    = "hit"
	cacheMiss   = "miss"
	cacheBypass = "bypass"
)

// NewCache caches up to size answers of inner (least recently used ones go first), counting
// in metrics (nil: metrics of its own, unregistered). When inner is a Fingerprinter its
// capabilities are digested now, so that a change is noticed later.
func NewCache(ctx context.Context, inner Hypervisor, size int, metrics *CacheMetrics) (*Cache, error) {
	if size < 1 {
		return nil, fmt.Errorf("libvirt answer cache: size %d: want at least 1", size)
	}
	if metrics == nil {
		metrics = NewCacheMetrics()
	}
	c := &Cache{inner: inner, answers: newLRU[string, []byte](size), now: time.Now, metrics: metrics}
	c.epoch.Store(cacheEpochs.Add(1))
	metrics.entries.Set(0)
	if fp, ok := inner.(Fingerprinter); ok {
		digest, err := fp.CapabilitiesDigest(ctx)
		if err != nil {
			return nil, fmt.Errorf("libvirt answer cache: %w", err)
		}
		c.fp, c.digest, c.checkedAt = fp, digest, c.now()
	}
	return c, nil
}

// Epoch identifies what the cache's answers hold for: it changes whenever the cache empties
// itself because the hypervisor's capabilities changed (which it checks here too, at most
// every CapabilitiesCheckInterval), and no two caches share one. What was derived from the
// answers of one epoch holds as long as the epoch does: a ShapeCache keys its entries by it.
func (c *Cache) Epoch(ctx context.Context) uint64 {
	c.checkCapabilities(ctx)
	return c.epoch.Load()
}

// Machines are the inner hypervisor's.
func (c *Cache) Machines() engine.Machines { return c.inner.Machines() }

// Len is the number of answers kept.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answers.len()
}

// DefineAndRead answers from the cache when a domain of the same shape was defined before,
// and asks the inner hypervisor otherwise.
func (c *Cache) DefineAndRead(ctx context.Context, domain *libvirtxml.Domain) ([]byte, error) {
	c.checkCapabilities(ctx)
	key, macs, ok := cacheKey(domain)
	if !ok {
		c.metrics.requests.WithLabelValues(cacheBypass).Inc()
		return c.inner.DefineAndRead(ctx, domain)
	}
	c.mu.Lock()
	if answer, found := c.answers.get(key); found {
		c.mu.Unlock()
		c.metrics.requests.WithLabelValues(cacheHit).Inc()
		return restoreMACs(answer, macs), nil
	}
	c.mu.Unlock()
	out, err := c.inner.DefineAndRead(ctx, domain)
	if err != nil {
		return nil, err
	}
	normalized, ok := normalizeMACs(out, macs)
	if !ok {
		c.metrics.requests.WithLabelValues(cacheBypass).Inc()
		return out, nil
	}
	c.metrics.requests.WithLabelValues(cacheMiss).Inc()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Another request may have filled it meanwhile: its answer stays.
	if _, found := c.answers.get(key); found {
		return out, nil
	}
	c.answers.put(key, normalized)
	c.metrics.entries.Set(float64(c.answers.len()))
	return out, nil
}

// checkCapabilities empties the cache when the hypervisor's capabilities changed since the
// last check, checking at most every CapabilitiesCheckInterval and by one request at a time.
// A failing check empties it too: nothing is known to hold any more.
func (c *Cache) checkCapabilities(ctx context.Context) {
	if c.fp == nil || !c.checkMu.TryLock() {
		return
	}
	defer c.checkMu.Unlock()
	now := c.now()
	if now.Sub(c.checkedAt) < CapabilitiesCheckInterval {
		return
	}
	c.checkedAt = now
	digest, err := c.fp.CapabilitiesDigest(ctx)
	if err == nil && digest == c.digest {
		return
	}
	c.digest = digest
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers.clear()
	c.epoch.Store(cacheEpochs.Add(1))
	c.metrics.entries.Set(0)
	c.metrics.flushes.Inc()
}

var canonicalMAC = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)

// cacheKey is the domain's XML without its name and UUID and with its MACs normalized, and
// the MACs (as libvirt writes them back: lower case) by equality class. ok is false for a
// domain the cache cannot normalize.
func cacheKey(domain *libvirtxml.Domain) (key string, macs []string, ok bool) {
	d := *domain
	d.Name, d.UUID = "", ""
	if d.Devices != nil && len(d.Devices.Interfaces) > 0 {
		devices := *d.Devices
		devices.Interfaces = make([]libvirtxml.DomainInterface, len(d.Devices.Interfaces))
		for i, iface := range d.Devices.Interfaces {
			if iface.MAC == nil || !canonicalMAC.MatchString(iface.MAC.Address) {
				return "", nil, false
			}
			mac := strings.ToLower(iface.MAC.Address)
			class := indexOf(macs, mac)
			if class < 0 {
				class = len(macs)
				macs = append(macs, mac)
			}
			normalized := *iface.MAC
			normalized.Address = fmt.Sprintf("%s:class%d", mac[:2], class)
			iface.MAC = &normalized
			devices.Interfaces[i] = iface
		}
		d.Devices = &devices
	}
	doc, err := d.Marshal()
	if err != nil {
		return "", nil, false
	}
	return doc, macs, true
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// libvirt writes an interface's MAC as <mac address='...'/>.
var macElement = regexp.MustCompile(`<mac address='([^']*)'`)

func macToken(i int) string { return fmt.Sprintf("virt-rules-mac-%d", i) }

// normalizeMACs replaces every MAC in libvirt's answer by its class's token; ok is false when
// the answer holds a MAC the request did not send.
func normalizeMACs(answer []byte, macs []string) ([]byte, bool) {
	ok := true
	out := macElement.ReplaceAllFunc(answer, func(m []byte) []byte {
		class := indexOf(macs, string(macElement.FindSubmatch(m)[1]))
		if class < 0 {
			ok = false
			return m
		}
		return []byte("<mac address='" + macToken(class) + "'")
	})
	return out, ok
}

// restoreMACs puts this request's MACs back into a cached answer.
func restoreMACs(answer []byte, macs []string) []byte {
	if len(macs) == 0 {
		return answer
	}
	pairs := make([]string, 0, 2*len(macs))
	for i, mac := range macs {
		pairs = append(pairs, "<mac address='"+macToken(i)+"'", "<mac address='"+mac+"'")
	}
	return []byte(strings.NewReplacer(pairs...).Replace(string(answer)))
}
