package migrationpolicy

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/keymutex"
)

// admittedPolicies are the MigrationPolicies this webhook admitted that the informer cache may
// not show yet. The webhook validates against the cache (a live LIST of every policy per
// admission does not keep up with a burst of creates at a thousand policies) plus these, and
// admits one policy at a time per comparison key (lockKey: only policies of the same key are
// compared), so two policies created a moment apart through this process are always compared
// when they can conflict, and admissions that cannot run side by side. A policy leaves the set
// when the cache shows it (same UID, at least its generation) or after admittedTTL, when its
// create was refused later in the chain or its update lost a conflict.
//
// Two replicas serve the webhook: a duplicate admitted by the other replica within the cache's
// propagation delay (milliseconds) can still get through, as two concurrent creates could
// through a live LIST. The status controller marks such a policy invalid afterwards
// (AnnotationValid), as it does a policy stored before virt-rules ran. The zero value is ready.
type admittedPolicies struct {
	// keys serialises the admissions of one comparison key, held across one admission: read
	// the cache, validate, remember. Hashed: two keys may share a lock, which only serialises
	// more than needed.
	keys keymutex.KeyMutex
	once sync.Once

	mu     sync.Mutex // guards byName
	byName map[string]admittedPolicy
	now    func() time.Time
}

// admissionLocks is how many locks the comparison keys hash to: admissions in flight at once
// are bounded by kube-apiserver's calls, far fewer.
const admissionLocks = 64

// lockKey holds the lock of comparison key until the returned function is called.
func (a *admittedPolicies) lockKey(key string) (unlock func()) {
	a.once.Do(func() { a.keys = keymutex.NewHashed(admissionLocks) })
	a.keys.LockKey(key)
	return func() { _ = a.keys.UnlockKey(key) }
}

type admittedPolicy struct {
	policy *unstructured.Unstructured
	at     time.Time
}

// admittedTTL bounds how long an admitted policy counts without the cache showing it.
const admittedTTL = 30 * time.Second

func (a *admittedPolicies) clock() time.Time {
	if a.now == nil {
		return time.Now()
	}
	return a.now()
}

// merge returns cached with the admitted policies the cache does not show yet in place of, or
// beside, their cached versions, and forgets those the cache shows or that expired. cached is
// not modified; list it with the comparison key's lock held (lockKey), so that no policy of
// that key leaves the set between the list and the merge.
func (a *admittedPolicies) merge(cached []*unstructured.Unstructured) []*unstructured.Unstructured {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.byName) == 0 {
		return cached
	}
	now := a.clock()
	pending := make(map[string]*unstructured.Unstructured, len(a.byName))
	for name, p := range a.byName {
		if now.Sub(p.at) > admittedTTL {
			delete(a.byName, name)
			continue
		}
		pending[name] = p.policy
	}
	out := make([]*unstructured.Unstructured, 0, len(cached)+len(pending))
	for _, c := range cached {
		p, ok := pending[c.GetName()]
		if !ok {
			out = append(out, c)
			continue
		}
		if c.GetUID() == p.GetUID() && c.GetGeneration() >= p.GetGeneration() {
			// The cache caught up: it is the one to compare with from now on.
			delete(a.byName, c.GetName())
			delete(pending, c.GetName())
			out = append(out, c)
		}
		// Otherwise the admitted version replaces the cached one (appended below).
	}
	for _, p := range pending {
		out = append(out, p)
	}
	return out
}

// remember records policy as admitted now, before its comparison key's lock is released.
func (a *admittedPolicies) remember(policy *unstructured.Unstructured) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byName == nil {
		a.byName = map[string]admittedPolicy{}
	}
	a.byName[policy.GetName()] = admittedPolicy{policy: policy, at: a.clock()}
}
