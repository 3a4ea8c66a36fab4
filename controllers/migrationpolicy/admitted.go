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

	mu     sync.Mutex // guards the rest
	byName map[string]admittedPolicy
	// byKey is the names admitted under each comparison key: an admission merges only those
	// of its own key, however many other keys' admissions are pending.
	byKey     map[string]map[string]struct{}
	lastSweep time.Time
	now       func() time.Time
}

type admittedPolicy struct {
	policy *unstructured.Unstructured
	key    string
	at     time.Time
}

// admittedTTL bounds how long an admitted policy counts without the cache showing it.
const admittedTTL = 30 * time.Second

// admissionLocks is how many locks the comparison keys hash to: admissions in flight at once
// are bounded by kube-apiserver's calls, far fewer.
const admissionLocks = 64

// lockKey holds the lock of comparison key until the returned function is called.
func (a *admittedPolicies) lockKey(key string) (unlock func()) {
	a.once.Do(func() { a.keys = keymutex.NewHashed(admissionLocks) })
	a.keys.LockKey(key)
	return func() { _ = a.keys.UnlockKey(key) }
}

func (a *admittedPolicies) clock() time.Time {
	if a.now == nil {
		return time.Now()
	}
	return a.now()
}

// merge returns cached, the stored policies of comparison key, with the policies admitted under
// key that the cache does not show yet beside them, and without the cached versions of any
// policy admitted since (under whatever key: an update may change it). It forgets the admitted
// policies the cache shows. cached is not modified; list it with key's lock held (lockKey), so
// that no policy of key leaves the set between the list and the merge.
func (a *admittedPolicies) merge(cached []*unstructured.Unstructured, key string) []*unstructured.Unstructured {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.byName) == 0 {
		return cached
	}
	now := a.clock()
	out := make([]*unstructured.Unstructured, 0, len(cached)+len(a.byKey[key]))
	for _, c := range cached {
		p, ok := a.byName[c.GetName()]
		if ok && now.Sub(p.at) > admittedTTL {
			a.forgetLocked(c.GetName())
			ok = false
		}
		if !ok {
			out = append(out, c)
			continue
		}
		if c.GetUID() == p.policy.GetUID() && c.GetGeneration() >= p.policy.GetGeneration() {
			// The cache caught up: it is the one to compare with from now on.
			a.forgetLocked(c.GetName())
			out = append(out, c)
		}
		// Otherwise the admitted version replaces the cached one (appended below if of key).
	}
	for name := range a.byKey[key] {
		p := a.byName[name]
		if now.Sub(p.at) > admittedTTL {
			a.forgetLocked(name)
			continue
		}
		out = append(out, p.policy)
	}
	return out
}

// remember records policy as admitted now under comparison key, before key's lock is
// released; now and then it forgets every expired admission, of whatever key.
func (a *admittedPolicies) remember(policy *unstructured.Unstructured, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byName == nil {
		a.byName, a.byKey = map[string]admittedPolicy{}, map[string]map[string]struct{}{}
	}
	now := a.clock()
	if now.Sub(a.lastSweep) > admittedTTL {
		for name, p := range a.byName {
			if now.Sub(p.at) > admittedTTL {
				a.forgetLocked(name)
			}
		}
		a.lastSweep = now
	}
	a.forgetLocked(policy.GetName())
	a.byName[policy.GetName()] = admittedPolicy{policy: policy, key: key, at: now}
	if a.byKey[key] == nil {
		a.byKey[key] = map[string]struct{}{}
	}
	a.byKey[key][policy.GetName()] = struct{}{}
}

// forgetLocked drops the admission of the policy named name. Call with mu held.
func (a *admittedPolicies) forgetLocked(name string) {
	p, ok := a.byName[name]
	if !ok {
		return
	}
	delete(a.byName, name)
	if names := a.byKey[p.key]; names != nil {
		delete(names, name)
		if len(names) == 0 {
			delete(a.byKey, p.key)
		}
	}
}
